#!/usr/bin/env python3
"""Call-stack sampling cost (issues #19, #37), side by side in one run: `dcpid --callchains fp` vs
`perf record -a -g -e cpu-clock -c N` at the same rate, or with `--callchains dwarf`,
`dcpid --callchains dwarf` vs `perf record -a --call-graph dwarf --buildid-mmap -N` (both copy
8 KiB of user stack a sample). --buildid-mmap -N: perf 6.1's build-id pass at the end of a
recording aborts here (MACHINE-FACTS.md); -B skips it but also leaves `perf script` unable to
unwind the DWARF stacks (measured on tests/e2e/libc_callers.c); --buildid-mmap takes the
build-ids from the MMAP2 records, with no pass, and the data unwinds.

For each collector: two copies of bench/workloads/cpu.c (built with frame pointers for fp, so
that both collectors unwind whole user stacks; without them for dwarf, so that only CFI does)
run a fixed amount of work while it samples; then
  - the collector's CPU during the workload (all its threads, /proc/PID/task/*/schedstat);
  - the workload's slowdown against a run without collector (median of --reps runs each);
  - the size of what it wrote: dcpid's database directory (after its final flush and
    publish) against perf.data, and each extrapolated to an hour linearly (an upper bound
    for dcpid, whose files grow with distinct stacks, not with time);
  - the collector's peak RSS (VmHWM) at the end of its run.

  bench/stacks.py [--short] [--callchains fp|dwarf|auto] [--rate 1000] [--settle S] [--iters N]
                  [--stack-one-in N] [--workload-fp yes|no]
                  [--dcpid target/release/dcpid] [--dcpictl DCPICTL]
                  [--ab OTHER_DCPID] [--together] [--out FILE]

--callchains auto runs `dcpid --callchains auto` against `perf record --call-graph dwarf` (both
copy 8 KiB a sample), the workload built with frame pointers unless --workload-fp no.
--stack-one-in N passes `--stack-one-in N` to dcpid (one sample's stack in N is unwound and
counts N; the flat profile keeps every sample).

Bytes: `bytes` is everything the collector wrote; for dcpid `bytes_without_one_time` leaves out
the files written once per kernel or build-id, not per hour (the kallsyms snapshot db/kallsyms/
and the symbol tables db/binaries/, as bench/slices.py does), and `perf_over_dcpid_size_*` in
the summary compare perf.data with both.

dcpid's spool goes on a tmpfs (--spool-parent, /dev/shm by default), as in production (the
systemd unit's RuntimeDirectory) and in bench/slices.py; its database and perf.data go on disk.
Before the twelfth session the spool was on disk here: each flush's spool append and fsync
were ext4 work in dcpid's flush thread.

--ab runs a second dcpid build ("dcpid_b") in the same alternation, for a before/after
comparison on this noisy machine (runs an hour apart differ by 50 %).

--together runs the collectors at once (dcpid, dcpid_b, perf), each started and settled, then
one workload window for all of them per repetition: each pays for the same machine state,
where an alternation puts each in a different minute of a VM whose costs swing 2-5x within
minutes. Each then also samples the others (a few more processes and stacks, alike for both),
and the workload's slowdown is all collectors' together.

The CPU is counted after start-up, as bench/collector.py does for #13: each collector runs
--settle seconds (default 20: past dcpid's first flush, which resolves and publishes every
image once, and past perf's synthesis of the existing processes) before the workload starts;
dcpid then sees the workload's binary once (a twentieth of its work) and runs until its
once-per-image threads (the symbol store, which stores each running image's symbol table on an
empty database at most a tenth of a CPU at a time, and the unwind-table loader) are idle, with
one flush between, so that its start-up (storing and publishing the images of a database it
has just created, the workload's and dcpictl's included) is not in the window either
(`settle_s` and `startup_idle` in the JSON say how long that took); and
the workload is long enough (--iters, default ~20 s here) that the cost of its own two new
processes is not most of the window. Both are a continuous profiler's steady state; the
first versions of this script counted dcpid's start-up in a 3 s window.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from collector import (HERE, ROOT, add_spool_parent, dcpictl_status, ms_per_s, spool_dir,
                       stage_split, threads_cpu_ns, vm_hwm_kib)


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(d, f))
            except OSError:
                pass
    return total


def peak_rss_kib(pid):
    """VmHWM of a running process, in KiB (0 if unreadable)."""
    return vm_hwm_kib(pid) or 0


def build(work, callchains, workload_fp=None):
    if workload_fp is None:
        workload_fp = callchains in ("fp", "auto")
    fp = "-fno-omit-frame-pointer" if workload_fp else "-fomit-frame-pointer"
    exe = os.path.join(work, "cpu-" + callchains)
    subprocess.run(["cc", "-O2", fp, "-o", exe,
                    os.path.join(HERE, "workloads", "cpu.c")], check=True)
    return exe


def workload(exe, iters):
    t = time.monotonic()
    ps = [subprocess.Popen([exe, str(iters)], stdout=subprocess.DEVNULL) for _ in range(2)]
    for p in ps:
        p.wait()
    return time.monotonic() - t


# Threads whose work is once per image, not per sample: the symbol store (storing each new
# build-id's symbol table, at most a tenth of a CPU at a time) and the unwind-table loader,
# by their names in /proc (cut to 15 bytes: "dcpi-unwind-load" reads "dcpi-unwind-loa").
ONCE_PER_IMAGE = ("dcpid-symstore", "dcpi-unwind-loa")


def symbols_queued(args, sock):
    """Images waiting for the symbol store's worker (`store.symbol_tables.queued` in
    `dcpictl status --json`; 0 from a dcpid without the counter). The worker pauses nine times
    its CPU time after each table, so an idle thread alone does not say that it is done."""
    st = dcpictl_status(args.dcpictl, sock) or {}
    return st.get("store", {}).get("symbol_tables", {}).get("queued", 0)


def wait_idle(pid, args, sock, deadline):
    """Until the symbol store's queue is empty and dcpid's once-per-image threads used under
    1 ms of CPU in each of two consecutive 2 s intervals, or the deadline; whether they did."""
    quiet, prev = 0, threads_cpu_ns(pid)
    while quiet < 2 and time.monotonic() < deadline:
        time.sleep(2)
        cur = threads_cpu_ns(pid)
        busy = sum(cur.get(k, 0) - prev.get(k, 0) for k in ONCE_PER_IMAGE) / 1e6
        quiet = quiet + 1 if busy < 1.0 and symbols_queued(args, sock) == 0 else 0
        prev = cur
    return quiet >= 2


def settle_dcpid(pid, args, sock):
    """After the fixed settle, dcpid's start-up work out of the window: the images the window
    runs (the workload's binary and dcpictl, each new to the fresh database) are run once
    first, a flush publishes what the start-up stored, and the once-per-image threads are
    waited on until idle (at most 300 s). A continuous profiler meets a binary's build-id once
    in its life; the window measures it afterwards. Returns how long dcpid ran before the
    window and whether its start-up work ended."""
    t0 = time.monotonic() - args.settle
    deadline = time.monotonic() + 300
    warm = subprocess.Popen([args.exe, str(args.iters // 20)], stdout=subprocess.DEVNULL)
    # dcpictl too: the window's own `dcpictl status` would otherwise be its first sight of
    # dcpictl's image (a 50 MB release binary, whose symbol table the store then reads and
    # whose first profile the flush publishes, in the window). Run until it was sampled
    # surely: about a second of calls.
    t = time.monotonic()
    while time.monotonic() - t < 1.5:
        subprocess.run([args.dcpictl, "--socket", sock, "status", "--json"],
                       capture_output=True, timeout=15)
    warm.wait()
    idle = wait_idle(pid, args, sock, deadline)
    subprocess.run([args.dcpictl, "--socket", sock, "flush"], capture_output=True, timeout=120)
    idle = wait_idle(pid, args, sock, deadline) and idle
    return {"settle_s": round(time.monotonic() - t0, 1), "startup_idle": idle}


class Run:
    """One collector's run: started (and settled) by `start`, measured over a workload window
    by `window` (alone, or with others in the same window: --together), ended by `finish`."""

    def __init__(self, kind, args, work):
        self.kind, self.args = kind, args
        self.d = tempfile.mkdtemp(prefix=f"stk-{kind}-", dir=work)
        self.dcpid = kind.startswith("dcpid")
        self.sock = self.spool = None
        self.s0 = self.s1 = None

    def start(self):
        args, d, kind = self.args, self.d, self.kind
        period = int(1e9 / args.rate)
        log = open(os.path.join(d, "log"), "w")
        if self.dcpid:
            exe_d = args.ab if kind == "dcpid_b" else args.dcpid
            self.sock = sock = os.path.join(d, "ctl.sock")
            self.spool = spool_dir(args, f"stk-{kind}-spool-")
            cmd = [exe_d, "--config", "none", "--db", os.path.join(d, "db"), "--spool",
                   self.spool, "--socket", sock, "--host", "bench", "-e",
                   f"cpu-clock:{period}", "--callchains", args.callchains]
            if args.stack_one_in != 1:
                cmd += ["--stack-one-in", str(args.stack_one_in)]
            ready = lambda: os.path.exists(sock)  # noqa: E731
            self.out = os.path.join(d, "db")
        else:
            self.out = out = os.path.join(d, "perf.data")
            graph = (["-g"] if args.callchains == "fp"
                     else ["--call-graph", "dwarf", "--buildid-mmap", "-N"])
            cmd = ["perf", "record", "-a", *graph, "-e", "cpu-clock", "-c", str(period), "-o", out]
            ready = lambda: os.path.exists(out) and os.path.getsize(out) > 0  # noqa: E731
        self.p = p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not ready():
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} did not start: {open(log.name).read()[-2000:]}")
            time.sleep(0.1)
        self.started = time.monotonic()
        time.sleep(args.settle)
        self.settled = {"settle_s": args.settle}
        if self.dcpid:
            self.settled = settle_dcpid(p.pid, args, self.sock)
        return self

    def begin(self):
        if self.dcpid:
            self.s0 = dcpictl_status(self.args.dcpictl, self.sock)
        self.a = threads_cpu_ns(self.p.pid)

    def end(self):
        self.b = threads_cpu_ns(self.p.pid)
        if self.dcpid:
            self.s1 = dcpictl_status(self.args.dcpictl, self.sock)

    def finish(self, t0, t1, wall):
        args, s0, s1 = self.args, self.s0, self.s1
        per_thread = ms_per_s(self.a, self.b, t1 - t0)
        cpu_ms_per_s = sum(per_thread.values())
        threads = {k: round(v, 4) for k, v in sorted(per_thread.items()) if v >= 0.0005}
        hwm = peak_rss_kib(self.p.pid)
        self.p.send_signal(2)
        self.p.wait(timeout=300)
        ran = time.monotonic() - self.started
        out = self.out
        size = du(out) if os.path.isdir(out) else os.path.getsize(out)
        res = {"cpu_ms_per_s": round(cpu_ms_per_s, 3), "threads_ms_per_s": threads,
               **self.settled, "workload_s": round(wall, 3), "peak_rss_kib": hwm,
               "bytes": size, "seconds_sampled": round(ran, 1),
               "bytes_per_hour_linear": int(size * 3600 / ran)}
        if s0 and s1:
            st0, st1 = s0["overhead"]["stage_cpu_s"], s1["overhead"]["stage_cpu_s"]
            res["stages_ms_per_s"] = {k: round((st1[k] - st0.get(k, 0)) * 1e3 / (t1 - t0), 4)
                                      for k in st1}
        if self.dcpid:
            stk = [os.path.join(r, f) for r, _, fs in os.walk(out) for f in fs
                   if f.endswith(".stk")]
            res["stack_file_bytes"] = sum(os.path.getsize(f) for f in stk)
            # The kernel symbol snapshot is stored once per database and boot, not per hour;
            # the symbol tables once per build-id (bench/slices.py's ONE_TIME).
            res["bytes_without_kallsyms"] = size - du(os.path.join(out, "kallsyms"))
            res["bytes_one_time"] = (du(os.path.join(out, "kallsyms"))
                                     + du(os.path.join(out, "binaries")))
            res["bytes_without_one_time"] = size - res["bytes_one_time"]
            if s1 and s1.get("stacks"):
                st = s1["stacks"]
                res["stacks_status"] = {k: st.get(k) for k in ("recorded", "truncated",
                                                                "skipped", "one_in")}
                if st.get("dwarf"):
                    res["stacks_status"].update({k: st["dwarf"].get(k) for k in (
                        "unwound", "fp_fallback", "unwind_ms", "fp_steps", "procs_loaded")})
        shutil.rmtree(self.d, ignore_errors=True)
        if self.spool:
            shutil.rmtree(self.spool, ignore_errors=True)
        return res


def window(runs, args, exe):
    """One workload window measured for every run in `runs` (all running meanwhile)."""
    for r in runs:
        r.begin()
    t0 = time.monotonic()
    wall = workload(exe, args.iters)
    t1 = time.monotonic()
    for r in runs:
        r.end()
    return [r.finish(t0, t1, wall) for r in runs]


def run_with(kind, args, work, exe):
    return window([Run(kind, args, work).start()], args, exe)[0]


def run_together(kinds, args, work, exe):
    """Every collector of `kinds` started and settled, then one workload window for all: the
    same machine state for each (this VM's costs swing 2-5x within minutes, more than most
    changes measured). Each collector also samples the others: a few more images and
    stacks each, alike."""
    runs = []
    try:
        for k in kinds:
            runs.append(Run(k, args, work).start())
        return dict(zip(kinds, window(runs, args, exe)))
    finally:
        for r in runs:
            if r.p.poll() is None:
                r.p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--callchains", choices=("fp", "dwarf", "auto"), default="fp",
                    help="fp: dcpid fp vs perf -g; dwarf (auto): dcpid dwarf (auto) vs perf "
                    "--call-graph dwarf")
    ap.add_argument("--stack-one-in", type=int, default=1,
                    help="dcpid --stack-one-in N: one sample's stack in N, each counting N")
    ap.add_argument("--workload-fp", choices=("yes", "no"),
                    help="build the workload with frame pointers (default: yes for fp and "
                    "auto, no for dwarf)")
    ap.add_argument("--rate", type=int, default=1000, help="samples per second per CPU")
    ap.add_argument("--dcpid", default=os.path.join(ROOT, "target/release/dcpid"))
    ap.add_argument("--settle", type=float, help="seconds between a collector's start and the "
                    "workload (default 20, 8 with --short)")
    ap.add_argument("--iters", type=int, help="work per copy of cpu.c (default 1e10, 3e8 with "
                    "--short)")
    add_spool_parent(ap, "a directory on disk adds an ext4 write and fsync per flush")
    ap.add_argument("--reps", type=int, help="repetitions of each collector, alternated (default "
                    "3, 1 with --short)")
    ap.add_argument("--ab", help="a second dcpid build to run in the same alternation")
    ap.add_argument("--together", action="store_true",
                    help="run every collector at once, in one workload window per repetition "
                    "(the same machine state for all; the slowdown figures are then the sum "
                    "of all collectors')")
    ap.add_argument("--dcpictl", help="for dcpid's stage counters (default: beside --dcpid)")
    ap.add_argument("--out", default=os.path.join(
        HERE, "results", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-stacks.json"))
    args = ap.parse_args()
    if args.dcpictl is None:
        args.dcpictl = os.path.join(os.path.dirname(args.dcpid), "dcpictl")
    if args.settle is None:
        args.settle = 8 if args.short else 20
    if args.reps is None:
        args.reps = 1 if args.short else 3
    if args.iters is None:
        args.iters = 300_000_000 if args.short else 10_000_000_000
    work = tempfile.mkdtemp(prefix="dcpi-stacks-")
    wfp = None if args.workload_fp is None else args.workload_fp == "yes"
    exe = build(work, args.callchains, wfp)
    args.exe = exe
    res = {"commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip(),
           "rate": args.rate, "callchains": args.callchains, "short": args.short,
           "settle_s": args.settle, "iters": args.iters, "stack_one_in": args.stack_one_in,
           "workload_fp": args.workload_fp, "loadavg_start": open("/proc/loadavg").read().strip(),
           "spool_parent": args.spool_parent, "reps": args.reps, "together": args.together,
           "runs": {}}
    kinds = ("dcpid",) + (("dcpid_b",) if args.ab else ()) + ("perf",)

    def record(kind, rep, r):
        res["runs"].setdefault(kind, []).append(r)
        print(f"{kind} rep {rep}: {json.dumps(r)}", flush=True)

    for rep in range(args.reps):
        record("none", rep, {"workload_s": round(workload(exe, args.iters), 3)})
        if args.together:
            for kind, r in run_together(kinds, args, work, exe).items():
                record(kind, rep, r)
        else:
            for kind in kinds:
                record(kind, rep, run_with(kind, args, work, exe))
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0]
               if not isinstance(v[0][f], dict)}
           for k, v in res["runs"].items()}
    base = med["none"]["workload_s"]
    res["summary"] = {
        k: {"slowdown_pct": round((m["workload_s"] / base - 1) * 100, 2),
            "cpu_ms_per_s": m["cpu_ms_per_s"], "bytes_per_hour_linear": m["bytes_per_hour_linear"],
            "peak_rss_kib": m["peak_rss_kib"], "bytes": m["bytes"]}
        for k, m in med.items() if k != "none"}
    d, p = res["summary"]["dcpid"], res["summary"]["perf"]
    res["summary"]["dcpid_over_perf_cpu"] = round(
        d["cpu_ms_per_s"] / max(p["cpu_ms_per_s"], 1e-9), 3)
    if args.together:
        # The ratio within each window (the same machine state for both), and its median.
        for k in [k for k in res["runs"] if k.startswith("dcpid")]:
            per = [round(a["cpu_ms_per_s"] / max(b["cpu_ms_per_s"], 1e-9), 3)
                   for a, b in zip(res["runs"][k], res["runs"]["perf"])]
            res["summary"][f"{k}_over_perf_cpu_per_window"] = per
            res["summary"][f"{k}_over_perf_cpu_median_window"] = statistics.median(per)
    res["summary"]["slowdown_points_over_perf"] = round(d["slowdown_pct"] - p["slowdown_pct"], 2)
    res["summary"]["perf_over_dcpid_size"] = round(
        p["bytes_per_hour_linear"] / max(d["bytes_per_hour_linear"], 1), 1)
    # The kernel symbol snapshot is written once per database and boot: without it, the
    # sizes of what grows with time (the hour itself is bench/disk.py --stacks).
    res["summary"]["perf_over_dcpid_size_without_kallsyms"] = round(
        med["perf"]["bytes"] / max(med["dcpid"]["bytes_without_kallsyms"], 1), 1)
    res["summary"]["perf_over_dcpid_size_without_one_time"] = round(
        med["perf"]["bytes"] / max(med["dcpid"]["bytes_without_one_time"], 1), 1)
    res["loadavg_end"] = open("/proc/loadavg").read().strip()
    # Where dcpid's time went, by stage, in its median repetition (by CPU).
    for k in [k for k in res["runs"] if k.startswith("dcpid")]:
        runs = [r for r in res["runs"][k] if "stages_ms_per_s" in r]
        if runs:
            mid = sorted(runs, key=lambda r: r["cpu_ms_per_s"])[len(runs) // 2]
            res["summary"][k]["split"] = stage_split(mid, med["perf"]["cpu_ms_per_s"])
    print(json.dumps(res["summary"], indent=1), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
