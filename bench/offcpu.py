#!/usr/bin/env python3
"""Off-CPU time cost (issue 40): `dcpid --off-cpu true` against `--off-cpu false`, and the
slowdown of a switch-heavy program (a pipe ping-pong between two threads pinned to CPUs 0 and 1)
under no collector, dcpid without and with off-CPU, and perf recording the same data the same
way (`perf record -a -g -c 1 -e context-switches --switch-events`). Debian's perf 6.1 here was
built without BUILD_BPF_SKEL: `perf record --off-cpu` prints "option `off-cpu' is being
ignored" and records nothing of it, so it cannot be the reference on this machine.

  bench/offcpu.py [--secs 10] [--rate 5000] [--reps 3] [--dcpid target/release/dcpid]
                  [--dcpictl target/release/dcpictl] [--out FILE]

1. Cost: dcpid (cpu-clock at 1 kHz, frame-pointer stacks) runs with off-CPU off, then on; in
   each, after --settle seconds, the ping-pong runs --secs paced to --rate round trips/s (each
   round trip is two context switches on each CPU). Reported: the machine's context switches
   per second per CPU (/proc/stat ctxt) during the window, dcpid's CPU (all threads,
   schedstat) and the off-CPU thread's own; the difference on - off in % of one CPU, and per
   switch.
2. Slowdown: the unpaced ping-pong's round trips/s under each collector (median of --reps).
3. Bytes: the off-CPU files dcpid published (flat profiles and stacks.off-cpu.stk).
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from collector import ROOT, dcpictl_status, threads_cpu_ns


def ctxt():
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("ctxt "):
                return int(line.split()[1])
    return 0


def build(work):
    exe = os.path.join(work, "pingpong")
    subprocess.run(["cc", "-O2", "-pthread", "-o", exe,
                    os.path.join(ROOT, "bench", "workloads", "pingpong.c")], check=True)
    return exe


def pingpong(exe, secs, rate):
    out = subprocess.run([exe, str(secs), str(rate)], capture_output=True, text=True, check=True)
    n, t = out.stdout.split()
    return int(n) / float(t)


class Dcpid:
    def __init__(self, args, work, off_cpu):
        self.dir = tempfile.mkdtemp(prefix="offcpu-", dir=work)
        self.sock = os.path.join(self.dir, "s.sock")
        self.args = args
        self.p = subprocess.Popen(
            [args.dcpid, "--config", "none", "--db", os.path.join(self.dir, "db"),
             "--spool", os.path.join(self.dir, "spool"), "--socket", self.sock,
             "--host", "bench", "--events", "cpu-clock:1000000", "--callchains", "fp",
             "--flush-interval", "5s", "--off-cpu", "true" if off_cpu else "false"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while dcpictl_status(args.dcpictl, self.sock) is None:
            if time.time() > deadline or self.p.poll() is not None:
                raise SystemExit("dcpid did not start: " + self.p.stderr.read().decode())
            time.sleep(0.2)

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=120)

    def off_cpu_bytes(self):
        files = glob.glob(os.path.join(self.dir, "db", "epochs", "*", "bench", "*off-cpu*"))
        return sum(os.path.getsize(f) for f in files), len(files)


def cost(args, work, exe, off_cpu):
    d = Dcpid(args, work, off_cpu)
    try:
        time.sleep(args.settle)
        c0, t0, s0 = threads_cpu_ns(d.p.pid), time.time(), ctxt()
        pingpong(exe, args.secs, args.rate)
        c1, t1, s1 = threads_cpu_ns(d.p.pid), time.time(), ctxt()
        st = dcpictl_status(args.dcpictl, d.sock) or {}
    finally:
        d.stop()
    secs = t1 - t0
    ncpu = os.cpu_count()
    total = sum(c1.values()) - sum(c0.values())
    own = c1.get("dcpi-offcpu", 0) - c0.get("dcpi-offcpu", 0)
    b, n = d.off_cpu_bytes()
    shutil.rmtree(d.dir, ignore_errors=True)
    return {
        "off_cpu": off_cpu,
        "secs": secs,
        "switches_per_s_per_cpu": (s1 - s0) / secs / ncpu,
        "dcpid_cpu_pct": 100 * total / 1e9 / secs,
        "offcpu_thread_cpu_pct": 100 * own / 1e9 / secs,
        "status_off_cpu": st.get("off_cpu"),
        "off_cpu_bytes": b,
        "off_cpu_files": n,
    }


def slowdown(args, work, exe, kind):
    d = perf = None
    if kind.startswith("dcpid"):
        d = Dcpid(args, work, kind == "dcpid+offcpu")
        time.sleep(args.settle)
    elif kind == "perf":
        data = os.path.join(work, "perf.data")
        perf = subprocess.Popen(
            ["perf", "record", "-a", "-g", "-c", "1", "-e", "context-switches",
             "--switch-events", "-B", "-N", "-q", "-o", data],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.settle)
    try:
        return [pingpong(exe, args.secs, 0) for _ in range(args.reps)]
    finally:
        if d:
            d.stop()
            shutil.rmtree(d.dir, ignore_errors=True)
        if perf:
            perf.send_signal(2)
            perf.wait(timeout=300)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--rate", type=float, default=5000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--settle", type=float, default=8)
    ap.add_argument("--dcpid", default=os.path.join(ROOT, "target", "release", "dcpid"))
    ap.add_argument("--dcpictl", default=os.path.join(ROOT, "target", "release", "dcpictl"))
    ap.add_argument("--out")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="offcpu-bench-")
    exe = build(work)
    res = {"cost": [cost(args, work, exe, False), cost(args, work, exe, True)]}
    off, on = res["cost"]
    res["extra_cpu_pct_of_one_cpu"] = on["dcpid_cpu_pct"] - off["dcpid_cpu_pct"]
    sw = on["switches_per_s_per_cpu"] * os.cpu_count()
    res["extra_ns_per_switch"] = res["extra_cpu_pct_of_one_cpu"] / 100 * 1e9 / sw if sw else 0
    res["extra_cpu_pct_at_10k_per_cpu"] = (
        res["extra_ns_per_switch"] * 10_000 * os.cpu_count() / 1e9 * 100)
    res["slowdown"] = {}
    for kind in ["none", "dcpid", "dcpid+offcpu", "perf"]:
        rts = slowdown(args, work, exe, kind)
        res["slowdown"][kind] = {"round_trips_per_s": rts, "median": statistics.median(rts)}
    base = res["slowdown"]["none"]["median"]
    for v in res["slowdown"].values():
        v["slowdown_pct"] = 100 * (base / v["median"] - 1) if v["median"] else None
    shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
