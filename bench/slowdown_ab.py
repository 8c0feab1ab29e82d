#!/usr/bin/env python3
"""Workload slowdown under several dcpid builds and perf record, in alternation (issue #13):
each repetition runs the workload (two copies of bench/workloads/mem.c or cpu.c) with no
collector, under each build and under `perf record -a`, at RATE samples/s per CPU; medians
per collector, against no collector.

  RATE=5000 REPS=5 WL=mem SETTLE=3 bench/slowdown_ab.py DCPID_A [DCPID_B ...]   (needs root)

SETTLE: seconds between a collector's start (dcpid answering `status`, perf writing its file)
and the workload's. With 3 (the default, as before), dcpid's first flush after start-up (every
image resolved and published once) falls inside the workload; with 15 or more it does not, as in
bench/collector.py.
"""

import json
import os
import statistics
import sys
import tempfile
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collector as C  # noqa: E402


def main():
    rate = int(os.environ.get("RATE", "5000"))
    reps = int(os.environ.get("REPS", "5"))
    wl_name = os.environ.get("WL", "mem")
    settle = float(os.environ.get("SETTLE", "3"))
    bins = sys.argv[1:]
    if not bins:
        sys.exit(__doc__)
    work = tempfile.mkdtemp(prefix="slowdown-ab-")
    wl = C.build_workloads(work)
    params = {"cpu": ["1500000000"], "mem": ["64", "100000000"]}
    dcpictl = os.path.join(C.ROOT, "target/release/dcpictl")
    configs = [("none", None)] + [("dcpid", b) for b in bins] + [("perf", None)]
    times = {}
    for rep in range(reps):
        for kind, b in configs:
            key = kind if b is None else b
            c = None
            if kind != "none":
                args = types.SimpleNamespace(dcpid=b, dcpictl=dcpictl, settle=settle, window=0)
                c = C.Collector(kind, rate, args, work)
                c.start()
            times.setdefault(key, []).append(C.run_workload(wl[wl_name], params[wl_name]))
            if c:
                c.stop()
        print(rep, {k: round(v[-1], 2) for k, v in times.items()}, flush=True)
    base = statistics.median(times["none"])
    print({k: f"{(statistics.median(v) / base - 1) * 100:+.2f} %" for k, v in times.items()})
    print(json.dumps(times))


if __name__ == "__main__":
    main()
