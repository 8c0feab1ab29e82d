#!/usr/bin/env python3
"""What a drain-thread wake-up and a sample cost dcpid, beside the floor (issue #13).

Two copies of one dcpid build sample the machine at the same time, at a low and a high rate per
CPU (default 100 Hz and 1 kHz), with two busy loops, and so does the floor of #13's design
(bench/workloads/floor.c: one pinned thread per CPU that wakes once a second at a random instant,
re-arms its period and consumes its ring, nothing else) at both rates. Over one window, each
one's CPU per thread comes from /proc/PID/task/*/schedstat, and dcpid's wake-ups and samples
per CPU from `dcpictl status --json`. Per drain thread, the two rates give two equations

    CPU/s = wakeups/s x cost_per_wakeup + samples/s x cost_per_sample

solved for both costs; the flush thread's CPU at the two rates splits the same way into a cost
per flush and a cost per sample. Side by side, so the machine's noise falls on all of them alike.

  bench/wake_model.py [--rates 100 1000] [--window 120] [--dcpid target/release/dcpid]
                      [--dcpictl target/release/dcpictl] [--out FILE]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from collector import build_floor, ms_per_s, threads_cpu_ns  # noqa: E402
from collector_ab import busy_loop  # noqa: E402


def status(dcpictl, sock):
    r = subprocess.run([dcpictl, "--socket", sock, "status", "--json"], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        sys.exit(f"wake_model.py: dcpictl status failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def per_cpu(st):
    return {c["cpu"]: (c["wakeups"], c["samples"]) for c in st["cpus"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", type=int, nargs=2, default=[100, 1000])
    ap.add_argument("--window", type=float, default=120)
    ap.add_argument("--settle", type=float, default=30)
    ap.add_argument("--dcpid", default=os.path.join(ROOT, "target/release/dcpid"))
    ap.add_argument("--dcpictl", default=os.path.join(ROOT, "target/release/dcpictl"))
    ap.add_argument("--out", default=os.path.join(
        HERE, "results", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-wake-model.json"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="dcpi-wake-model-")
    busy = busy_loop(work)
    floor = build_floor(work)
    loads = [subprocess.Popen([busy]) for _ in range(2)]
    dcpids, floors = [], []
    try:
        for r in args.rates:
            d = f"{work}/d{r}"
            os.makedirs(d)
            dcpids.append(subprocess.Popen(
                [args.dcpid, "--config", "none", "--db", f"{d}/db", "--spool", f"{d}/spool",
                 "--socket", f"{d}/s.sock", "--host", f"m{r}", "-e",
                 f"cpu-clock:{int(1e9 / r)}"], stderr=open(f"{d}/log", "w")))
            floors.append(subprocess.Popen(
                [floor, "percpu", str(int(1e9 / r)),
                 str(args.settle + args.window + 60)], stdout=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        socks = [f"{work}/d{r}/s.sock" for r in args.rates]
        while not all(os.path.exists(s) for s in socks):
            if time.monotonic() > deadline or any(p.poll() is not None for p in dcpids):
                sys.exit("wake_model.py: dcpid did not start")
            time.sleep(0.2)
        time.sleep(args.settle)
        s0 = [status(args.dcpictl, s) for s in socks]
        c0 = [threads_cpu_ns(p.pid) for p in dcpids + floors]
        t0 = time.monotonic()
        time.sleep(args.window)
        c1 = [threads_cpu_ns(p.pid) for p in dcpids + floors]
        secs = time.monotonic() - t0
        s1 = [status(args.dcpictl, s) for s in socks]
    finally:
        for p in dcpids + floors + loads:
            p.terminate()
        for p in dcpids + floors + loads:
            p.wait()
    n = len(args.rates)
    cpu = [ms_per_s(a, b, secs) for a, b in zip(c0, c1)]
    res = {"commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip(),
           "window_s": round(secs, 1), "rates": args.rates, "dcpid": {}, "floor": {},
           "drain_threads": {}, "flush_thread": {}}
    for i, r in enumerate(args.rates):
        res["dcpid"][r] = {k: round(v, 4) for k, v in sorted(cpu[i].items()) if v > 0}
        res["dcpid"][r]["total"] = round(sum(cpu[i].values()), 4)
        res["floor"][r] = round(sum(cpu[n + i].values()), 4)
    # Per CPU: (wake-ups/s, samples/s, ms/s) at each rate, then the two costs.
    for c in sorted(per_cpu(s1[0])):
        rows = []
        for i in range(n):
            w1, x1 = per_cpu(s1[i])[c]
            w0, x0 = per_cpu(s0[i]).get(c, (0, 0))
            rows.append(((w1 - w0) / secs, (x1 - x0) / secs, cpu[i].get(f"dcpi-drain-{c}", 0)))
        (wa, sa, ma), (wb, sb, mb) = rows
        det = wa * sb - wb * sa
        per_wake = (ma * sb - mb * sa) / det * 1e3 if det else float("nan")
        per_sample = (wa * mb - wb * ma) / det * 1e6 if det else float("nan")
        res["drain_threads"][c] = {
            "wakeups_per_s": [round(wa, 3), round(wb, 3)],
            "samples_per_s": [round(sa, 1), round(sb, 1)],
            "ms_per_s": [round(ma, 4), round(mb, 4)],
            "us_per_wakeup": round(per_wake, 1), "ns_per_sample": round(per_sample, 1)}
    sa = sum(v["samples_per_s"][0] for v in res["drain_threads"].values())
    sb = sum(v["samples_per_s"][1] for v in res["drain_threads"].values())
    fa, fb = cpu[0].get("dcpid-flush", 0), cpu[1].get("dcpid-flush", 0)
    per_sample = (fb - fa) / (sb - sa) * 1e6 if sb != sa else float("nan")
    res["flush_thread"] = {"ms_per_s": [round(fa, 4), round(fb, 4)],
                           "samples_per_s": [round(sa, 1), round(sb, 1)],
                           "fixed_ms_per_s": round(fa - sa * per_sample / 1e6, 4),
                           "ns_per_sample": round(per_sample, 1)}
    fl = res["floor"]
    print(json.dumps(res, indent=1))
    for c, v in res["drain_threads"].items():
        print(f"drain-{c}: {v['us_per_wakeup']} us per wake-up, {v['ns_per_sample']} ns per sample")
    print(f"flush: {res['flush_thread']['fixed_ms_per_s']} ms/s fixed, "
          f"{res['flush_thread']['ns_per_sample']} ns per sample")
    print("floor: " + ", ".join(f"{r} Hz {fl[r]} ms/s" for r in args.rates))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
