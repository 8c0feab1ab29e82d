#!/usr/bin/env python3
"""Kernel threads' CPU in the first 40 s of a collector (issue #13, the 5 kHz start-up tail):
dcpid and `perf record -a` one after the other at RATE samples/s per CPU (default 5000), no
workload. Every 5 s: the CPU of all kernel threads (children of kthreadd, from
/proc/PID/schedstat), with the four largest by name, and /proc/stat's irq + softirq time (0
without CONFIG_IRQ_TIME_ACCOUNTING). Work that dcpid's start-up leaves to kernel threads
(writeback, journal commits) would show here and not in dcpid's own CPU.

  bench/startup_kthreads.py [REPS]      (needs root; dcpid from target/release)
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATE = int(os.environ.get("RATE", "5000"))


def kthreads():
    out = {}
    for st in glob.glob("/proc/[0-9]*/stat"):
        try:
            s = open(st).read()
            ppid = int(s.rsplit(")", 1)[1].split()[1])
            pid = int(st.split("/")[2])
            if ppid != 2 and pid != 2:
                continue
            comm = s[s.index("(")+1:s.rindex(")")]
            ns = int(open(f"/proc/{pid}/schedstat").read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        key = comm.split("/")[0].split("-")[0]
        out[key] = out.get(key, 0) + ns
    return out
def irq():
    f = open("/proc/stat").readline().split()
    return (int(f[6]) + int(f[7])) * 10  # irq+softirq, ms (USER_HZ=100)
def run(kind, rate):
    d = tempfile.mkdtemp(prefix="tail-")
    period = int(1e9 / rate)
    if kind == "dcpid":
        cmd = [os.path.join(ROOT, "target/release/dcpid"), "--config", "none", "--db", d + "/db", "--spool", d + "/spool",
               "--socket", d + "/s.sock", "--host", "t", "-e", f"cpu-clock:{period}"]
    else:
        cmd = ["perf", "record", "-B", "-N", "-a", "-e", "cpu-clock", "-c", str(period), "-o", d + "/perf.data"]
    k0, i0 = kthreads(), irq()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    prev_k, prev_i = k0, i0
    for w in range(8):
        time.sleep(5)
        k, i = kthreads(), irq()
        delta = {n: (k[n] - prev_k.get(n, 0)) / 1e6 for n in k if k[n] - prev_k.get(n, 0) > 200_000}
        rows.append((w * 5 + 5, round(sum(delta.values()), 1), i - prev_i, dict(sorted(delta.items(), key=lambda x: -x[1])[:4])))
        prev_k, prev_i = k, i
    p.send_signal(2); p.wait()
    subprocess.run(["rm", "-rf", d])
    return rows
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    for kind in ("dcpid", "perf"):
        for t, kms, irqms, top in run(kind, RATE):
            print(kind, rep, f"t<={t}s kthreads {kms} ms irq+softirq {irqms} ms", json.dumps({k: round(v, 1) for k, v in top.items()}), flush=True)
