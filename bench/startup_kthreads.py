#!/usr/bin/env python3
"""Kernel threads' CPU in the first 40 s of a collector (issue #13, the 5 kHz start-up tail):
dcpid and `perf record -a` one after the other at RATE samples/s per CPU (default 5000), no
workload. Every 5 s: the CPU of all kernel threads (children of kthreadd, from
/proc/PID/schedstat), with the four largest by name, and /proc/stat's irq + softirq time (0
without CONFIG_IRQ_TIME_ACCOUNTING). Work that dcpid's start-up leaves to kernel threads
(writeback, journal commits) would show here and not in dcpid's own CPU.

  RATE=5000 bench/startup_kthreads.py [REPS]      (needs root; target/release/dcpid, dcpictl)
"""

import glob
import json
import os
import shutil
import sys
import tempfile
import time
import types

import collector as C

RATE = int(os.environ.get("RATE", "5000"))
WINDOWS, WINDOW_S = 8, 5


def kthreads():
    """{kernel thread name without its instance suffix: CPU ns}."""
    out = {}
    for st in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(st) as f:
                s = f.read()
            pid = int(st.split("/")[2])
            ppid = int(s.rsplit(")", 1)[1].split()[1])
            if ppid != 2 and pid != 2:
                continue
            with open(f"/proc/{pid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        name = s[s.index("(") + 1:s.rindex(")")].split("/")[0].split("-")[0]
        out[name] = out.get(name, 0) + ns
    return out


def irq_ms():
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    return (int(cpu[6]) + int(cpu[7])) * 10  # irq + softirq, in USER_HZ (100) ticks


def run(kind, work):
    args = types.SimpleNamespace(dcpid=os.path.join(C.ROOT, "target/release/dcpid"),
                                 dcpictl=os.path.join(C.ROOT, "target/release/dcpictl"),
                                 settle=0, window=0)
    prev_k, prev_i = kthreads(), irq_ms()
    c = C.Collector(kind, RATE, args, work)
    c.start()
    rows = []
    try:
        for w in range(WINDOWS):
            time.sleep(WINDOW_S)
            k, i = kthreads(), irq_ms()
            delta = {n: (k[n] - prev_k.get(n, 0)) / 1e6 for n in k
                     if k[n] - prev_k.get(n, 0) > 200_000}
            top = sorted(delta.items(), key=lambda x: -x[1])[:4]
            rows.append(((w + 1) * WINDOW_S, round(sum(delta.values()), 1), i - prev_i,
                         {n: round(v, 1) for n, v in top}))
            prev_k, prev_i = k, i
    finally:
        c.stop()
    return rows


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    work = tempfile.mkdtemp(prefix="dcpi-kthreads-")
    try:
        for rep in range(reps):
            for kind in ("dcpid", "perf"):
                for t, kms, irq, top in run(kind, work):
                    print(kind, rep, f"t<={t}s kthreads {kms} ms irq+softirq {irq} ms",
                          json.dumps(top), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
