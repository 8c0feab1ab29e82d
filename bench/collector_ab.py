#!/usr/bin/env python3
"""Collector cost of several dcpid builds side by side (issue #13): the builds sample the same
machine at the same time (cpu-clock at 1 kHz per CPU, two busy loops), and each one's CPU per
thread is read from /proc/PID/task/*/schedstat over the same window. On a noisy machine this
compares builds better than runs of bench/collector.py one after the other.

  W=SECONDS bench/collector_ab.py DCPID_A DCPID_B [...]     (default W=120; needs root)

WL=py runs the two busy loops as Python loops instead of C ones, as bench/collector.py does:
the interpreter's thousands of pcs fill the aggregation tables as a real program does, where a
C loop's few pcs hit the same entries over and over. EXTRA="ARGS" adds arguments to every
dcpid (for example EXTRA="--callchains fp" to compare the cost of call stacks).
"""

import glob
import os
import subprocess
import sys
import tempfile
import time

import collector

HERE = os.path.dirname(os.path.abspath(__file__))


def busy_loop(work):
    src = os.path.join(work, "busy.c")
    with open(src, "w") as f:
        f.write("int main(void) { volatile unsigned long x = 0; for (;;) x++; }\n")
    exe = os.path.join(work, "busy")
    subprocess.run(["cc", "-O2", "-o", exe, src], check=True)
    return exe


def per_thread_ns(pid, binary):
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            comm = open(f"{t}/comm").read().strip()
            ns = int(open(f"{t}/schedstat").read().split()[0])
        except OSError:
            continue
        comm = "main" if comm == os.path.basename(binary)[:15] else comm
        out[comm] = out.get(comm, 0) + ns
    return out


def main():
    window = float(os.environ.get("W", "120"))
    bins = sys.argv[1:]
    if not bins:
        sys.exit(__doc__)
    work = tempfile.mkdtemp(prefix="collector-ab-")
    if os.environ.get("WL", "c") == "py":
        loads = collector.busy(2)
    else:
        loads = [subprocess.Popen([busy_loop(work)]) for _ in range(2)]
    procs = []
    try:
        for i, b in enumerate(bins):
            d = os.path.join(work, f"d{i}")
            os.makedirs(d)
            procs.append(subprocess.Popen(
                [b, "--config", "none", "--db", f"{d}/db", "--spool", f"{d}/spool",
                 "--socket", f"{d}/s.sock", "--host", "ab", "-e", "cpu-clock:1000000"]
                + os.environ.get("EXTRA", "").split(),
                stderr=open(f"{d}/log", "w")))
        time.sleep(10)
        s0 = [per_thread_ns(p.pid, b) for p, b in zip(procs, bins)]
        t0 = time.monotonic()
        time.sleep(window)
        s1 = [per_thread_ns(p.pid, b) for p, b in zip(procs, bins)]
        secs = time.monotonic() - t0
    finally:
        for p in procs + loads:
            p.terminate()
        for p in procs + loads:
            p.wait()
    for b, a, z in zip(bins, s0, s1):
        per = {k: (z[k] - a.get(k, 0)) / 1e6 / secs for k in z}
        print(f"{b}: total {sum(per.values()):.3f} ms/s  "
              + "  ".join(f"{k} {v:.3f}" for k, v in sorted(per.items()) if v >= 0.0005))


if __name__ == "__main__":
    main()
