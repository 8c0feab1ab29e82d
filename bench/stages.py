#!/usr/bin/env python3
"""Where dcpid's own CPU goes, per thread and per stage (issue #13's "show where the time goes").

dcpid (built with frame pointers) samples the machine at RATE per CPU while two busy loops keep
both CPUs full. After start-up, `perf record -e cpu-clock -c 10000 --call-graph fp -p DCPID`
samples dcpid's own threads every 10 us of their CPU time, kernel and user frames. Each sample
is put in one stage by the innermost frame that names one (the rules below), per thread:

  drain threads:  wait (poll/schedule, the wake-up itself), rearm (PERF_EVENT_IOC_PERIOD),
                  parse (reading and decoding ring records), aggregate (queue, watermark,
                  per-CPU table), other
  flush thread:   resolve (taking the tables, pc -> image + offset), spool (appending to the
                  spool and its fdatasync), publish (profile files, fsync, rename),
                  store (merging into the in-memory profiles), status, wait, other

The per-thread totals are scaled to the thread's CPU from /proc/PID/task/*/schedstat over the
same window, so the stages add up to the measured ms/s (perf's own interrupts inflate what it
samples; the split, not the sum, is what it gives).

  bench/stages.py [--rate 1000] [--window 120] [--settle 40] [--build] [--out FILE]

--build builds the frame-pointer binaries into target/fp first (otherwise they must exist).
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FP_TARGET = os.path.join(ROOT, "target", "fp")
sys.path.insert(0, HERE)
from collector import busy, ms_per_s, threads_cpu_ns  # noqa: E402

# (stage, substrings of a frame's symbol): the innermost frame (leaf first) that matches any
# rule decides; rules are tried in order on each frame.
DRAIN_RULES = [
    ("rearm", ["perf_event_period", "set_period", "_perf_ioctl", "perf_ioctl"]),
    ("wait", ["do_sys_poll", "do_poll", "poll_ring", "schedule", "__x64_sys_poll",
              "__x64_sys_ppoll", "finish_task_switch", "hrtimer"]),
    ("parse", ["read_pass", "parse_record", "RingReader", "records::"]),
    ("aggregate", ["aggregate_pending", "aggregate_cpu", "on_drain", "Aggregator", "who::",
                   "Table", "AsidCache"]),
]
FLUSH_RULES = [
    ("publish", ["publish::", "profile_format::atomic", "write_atomic", "Publisher"]),
    ("spool", ["spool::", "Spool"]),
    ("resolve", ["take_resolved", "take_tables", "resolve_entry", "Resolver", "resolve::"]),
    ("store", ["Store::add", "absorb", "store::"]),
    ("status", ["status", "record_tick"]),
    ("wait", ["do_nanosleep", "futex_wait", "schedule", "finish_task_switch", "recv_timeout",
              "park"]),
]


def classify(frames, rules):
    for sym in frames:
        for stage, keys in rules:
            if any(k in sym for k in keys):
                return stage
    return "other"


def parse_script(text):
    """perf script output -> [(comm, [symbols leaf first])]."""
    out, comm, frames = [], None, []
    for line in text.splitlines():
        if not line.strip():
            if comm is not None:
                out.append((comm, frames))
            comm, frames = None, []
            continue
        if comm is None:
            comm = line.split()[0] if line.split() else "?"
            # Thread names may hold spaces in principle; dcpid's do not.
            continue
        parts = line.strip().split(None, 1)
        if len(parts) == 2:
            frames.append(parts[1].rsplit(" (", 1)[0])
    if comm is not None:
        out.append((comm, frames))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--window", type=float, default=120)
    ap.add_argument("--settle", type=float, default=40)
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--dcpid", default=os.path.join(FP_TARGET, "release", "dcpid"))
    ap.add_argument("--out", default=os.path.join(
        HERE, "results", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-stages.json"))
    args = ap.parse_args()
    if args.build:
        env = dict(os.environ, RUSTFLAGS="-C force-frame-pointers=yes", CARGO_TARGET_DIR=FP_TARGET)
        subprocess.run(["cargo", "build", "--release", "-p", "dcpi-daemon"], cwd=ROOT, env=env,
                       check=True)
    if shutil.which("perf") is None:
        sys.exit("stages.py: perf is not installed (apt-get install linux-perf)")
    work = tempfile.mkdtemp(prefix="dcpi-stages-")
    loops = busy(2)
    d = None
    try:
        d = subprocess.Popen([args.dcpid, "--config", "none", "--db", f"{work}/db", "--spool",
                              f"{work}/spool", "--socket", f"{work}/sock", "--host", "bench", "-e",
                              f"cpu-clock:{int(1e9 / args.rate)}"],
                             stdout=subprocess.DEVNULL, stderr=open(f"{work}/dcpid.log", "w"))
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{work}/sock") and time.monotonic() < deadline:
            if d.poll() is not None:
                sys.exit(f"stages.py: dcpid exited: {open(f'{work}/dcpid.log').read()[-2000:]}")
            time.sleep(0.2)
        time.sleep(args.settle)
        a, t0 = threads_cpu_ns(d.pid), time.monotonic()
        subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-c", "10000", "--call-graph",
                        "fp", "-p", str(d.pid), "-o", f"{work}/perf.data", "--", "sleep",
                        str(args.window)], check=True, stdout=subprocess.DEVNULL)
        b, t1 = threads_cpu_ns(d.pid), time.monotonic()
        script = subprocess.run(["perf", "script", "-i", f"{work}/perf.data", "-F",
                                 "comm,ip,sym"], capture_output=True, text=True, check=True).stdout
    finally:
        for p in loops:
            p.kill()
            p.wait()
        if d is not None:
            d.send_signal(2)
            d.wait(timeout=120)
    secs = t1 - t0
    cpu = ms_per_s(a, b, secs)
    counts = collections.defaultdict(collections.Counter)
    # What "other" is made of: (leaf, first dcpid frame) pairs, for the next rule or fix.
    others = collections.defaultdict(collections.Counter)
    for comm, frames in parse_script(script):
        rules = DRAIN_RULES if comm.startswith("dcpi-drain") else \
            FLUSH_RULES if comm == "dcpid-flush" else None
        stage = classify(frames, rules) if rules else "all"
        counts[comm][stage] += 1
        if stage == "other" and frames:
            ours = next((f for f in frames if "dcpi" in f), "?")
            others[comm][f"{frames[0]} <- {ours}"] += 1
    res = {"commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip(),
           "rate": args.rate, "window_s": round(secs, 1), "threads": {}}
    total = 0.0
    for comm in sorted(cpu):
        ms = cpu[comm]
        total += ms
        n = sum(counts[comm].values())
        stages = {s: round(ms * c / n, 4) for s, c in counts[comm].most_common()} if n else {}
        res["threads"][comm] = {"cpu_ms_per_s": round(ms, 4), "perf_samples": n,
                                "stages_ms_per_s": stages,
                                "other_top": others[comm].most_common(12)}
        print(f"{comm:14} {ms:7.3f} ms/s  ({n} samples)  " +
              "  ".join(f"{s} {v:.3f}" for s, v in stages.items()))
    res["total_ms_per_s"] = round(total, 4)
    print(f"{'total':14} {total:7.3f} ms/s")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
