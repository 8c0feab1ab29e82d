#!/usr/bin/env python3
"""Off-CPU time cost (issue 40): `dcpid --off-cpu true` against `--off-cpu false`, and the
slowdown of a switch-heavy program (a pipe ping-pong between two threads pinned to CPUs 0 and 1)
under no collector, dcpid without and with off-CPU, and perf recording the same data the same
way (`perf record -a -g -c 1 -e context-switches --switch-events`). Debian's perf 6.1 here was
built without BUILD_BPF_SKEL: `perf record --off-cpu` prints "option `off-cpu' is being
ignored" and records nothing of it, so it cannot be the reference on this machine.

  bench/offcpu.py [--secs 10] [--rate 5000] [--reps 3] [--dcpid target/release/dcpid]
                  [--dcpictl target/release/dcpictl] [--base-dcpid OTHER] [--cost-reps 1]
                  [--no-slowdown] [--no-cost] [--bytes-secs 0] [--kinds K,K] [--out FILE]
                  [--source SRC] [--base-source SRC] [--cost-settle S]

--source / --base-source: dcpid's --off-cpu-source for the runs and for the base runs (with
--base-source alone the base is the same binary with that source: e.g. --source tracepoint
--base-source switch-records puts the two mechanisms side by side).

--sources SRC,SRC: measure the cost of each of these --off-cpu-source values (interleaved with
the off runs, --cost-reps times each), and add a slowdown kind "dcpid+offcpu:SRC" for each. For
the bpf source, dcpid's own CPU is only the reading of the aggregate: the program runs in the
switching threads, in the kernel. Its time is measured too, with kernel.bpf_stats_enabled=1
during the window (run_time_ns / run_cnt of the `on_switch` program: "bpf_prog_ns_per_run",
and in % of one CPU); the perf sources' kernel-side work (writing records) is not measured.

--same-cpu: the slowdown runs put both ping-pong threads on CPU 0 (argv[3] of the workload), so
that the round trips are CPU-bound: on a VM where the two-CPU ping-pong waits for an idle CPU to
wake (and any collector speeds it up), this is where the kernel's work per switch shows.

--base-dcpid: another dcpid binary (e.g. the commit before a change) whose off-CPU cost is
measured in the same run, interleaved with --dcpid's (off, on, base on; --cost-reps times), so
that both see the same machine load: "before" and "after" side by side.

1. Cost: dcpid (cpu-clock at 1 kHz, frame-pointer stacks) runs with off-CPU off, then on; in
   each, after --settle seconds, the ping-pong runs --secs paced to --rate round trips/s (each
   round trip is two context switches on each CPU). Reported: the machine's context switches
   per second per CPU (/proc/stat ctxt) during the window, dcpid's CPU (all threads,
   schedstat) and the off-CPU thread's own; the difference on - off in % of one CPU, and per
   switch.
2. Slowdown: the unpaced ping-pong's round trips/s under each collector (median of --reps,
   interleaved): none, dcpid without and with off-CPU (and --base-dcpid with it), perf
   recording the same events, and perf recording sched:sched_switch with stacks.
3. Bytes: the off-CPU files dcpid published (flat profiles and stacks.off-cpu.stk); with
   --bytes-secs, bytes per core-day side by side (bytes_run states the method).
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


def pingpong(exe, secs, rate, same_cpu=False):
    args = [exe, str(secs), str(rate)] + (["0"] if same_cpu else [])
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    n, t = out.stdout.split()
    return int(n) / float(t)


class Dcpid:
    def __init__(self, args, work, off_cpu, exe=None, source=None):
        self.dir = tempfile.mkdtemp(prefix="offcpu-", dir=work)
        self.sock = os.path.join(self.dir, "s.sock")
        self.args = args
        self.p = subprocess.Popen(
            [exe or args.dcpid, "--config", "none", "--db", os.path.join(self.dir, "db"),
             "--spool", os.path.join(self.dir, "spool"), "--socket", self.sock,
             "--host", "bench", "--events", "cpu-clock:1000000", "--callchains", args.callchains,
             "--flush-interval", "5s", "--off-cpu", "true" if off_cpu else "false",
             *(["--off-cpu-source", source] if off_cpu and source else [])],
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


def cost(args, work, exe, off_cpu, dcpid=None, source=None):
    d = Dcpid(args, work, off_cpu, dcpid, source)
    try:
        # Past dcpid's start-up work (its first flush, the symbol store's first pass over the
        # running images: ~0.1 s of CPU in the first minute), which is not off-CPU's cost.
        time.sleep(args.cost_settle if args.cost_settle is not None else args.settle)
        stats = BpfStats() if off_cpu else None
        c0, t0, s0 = threads_cpu_ns(d.p.pid), time.time(), ctxt()
        p0 = stats.read() if stats else None
        pingpong(exe, args.secs, args.rate)
        c1, t1, s1 = threads_cpu_ns(d.p.pid), time.time(), ctxt()
        p1 = stats.read() if stats else None
        if stats:
            stats.close()
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
        "dcpid": dcpid or args.dcpid,
        "off_cpu": off_cpu,
        "source": (st.get("off_cpu") or {}).get("source"),
        "secs": secs,
        "switches_per_s_per_cpu": (s1 - s0) / secs / ncpu,
        "dcpid_cpu_pct": 100 * total / 1e9 / secs,
        "offcpu_thread_cpu_pct": 100 * own / 1e9 / secs,
        "offcpu_thread_ns_per_switch": own / ((s1 - s0) or 1),
        "status_off_cpu": st.get("off_cpu"),
        **bpf_prog_cost(p0, p1, secs),
        "off_cpu_bytes": b,
        "off_cpu_files": n,
    }


class BpfStats:
    """kernel.bpf_stats_enabled=1 while alive (restored on close), and the run time and count
    of dcpid's `on_switch` program (bpftool prog show)."""

    PATH = "/proc/sys/kernel/bpf_stats_enabled"

    def __init__(self):
        try:
            with open(self.PATH) as f:
                self.old = f.read().strip()
            with open(self.PATH, "w") as f:
                f.write("1")
        except OSError:
            self.old = None

    def read(self):
        if self.old is None or not shutil.which("bpftool"):
            return None
        out = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True,
                             text=True)
        try:
            progs = json.loads(out.stdout)
        except ValueError:
            return None
        for p in progs:
            if p.get("name") == "on_switch" and "run_cnt" in p:
                return (p.get("run_time_ns", 0), p["run_cnt"])
        return None

    def close(self):
        if self.old is not None:
            with open(self.PATH, "w") as f:
                f.write(self.old)


def bpf_prog_cost(p0, p1, secs):
    """The BPF program's time over the window (none for the perf sources)."""
    if not p0 or not p1:
        return {}
    ns, runs = p1[0] - p0[0], p1[1] - p0[1]
    return {
        "bpf_prog_runs": runs,
        "bpf_prog_ns_per_run": ns / runs if runs else 0,
        "bpf_prog_cpu_pct": 100 * ns / 1e9 / secs,
    }


# perf's ways to record what an off-CPU profile needs, without BPF (`--off-cpu` is ignored by
# this perf build): the same events dcpid opens, or the sched_switch tracepoint with stacks.
PERF_KINDS = {
    "perf": ["-c", "1", "-e", "context-switches", "--switch-events"],
    "perf-sched_switch": ["-e", "sched:sched_switch"],
    # What `dcpid --off-cpu true` records, the same way: its sampled event (cpu-clock at 1 kHz
    # per CPU with frame-pointer chains) and the switches; "perf" above records the switches
    # alone, so it is the reference for off-CPU's share (dcpid+offcpu - dcpid).
    "perf-all": ["-e", "cpu-clock/period=1000000/", "-e", "context-switches/period=1/",
                 "--switch-events"],
    # What `dcpid --off-cpu true --off-cpu-source tracepoint` records: the sampled event, the
    # blocking switch-outs with chains (the tracepoint, filtered in the kernel) and the switch
    # records.
    "perf-tp-sw": ["-e", "cpu-clock/period=1000000/",
                   "-e", "sched:sched_switch", "--filter", "prev_pid != 0 && prev_state & 255",
                   "--switch-events"],
    # The same with the tracepoint's switch-ins instead of switch records, which miss a
    # thread woken on a CPU that just went idle on this kernel (daemon/src/offcpu/mod.rs):
    # less than the data dcpid needs.
    "perf-all-tp": ["-e", "cpu-clock/period=1000000/",
                    "-e", "sched:sched_switch", "--filter", "prev_pid != 0 && prev_state & 255",
                    "-e", "sched:sched_switch/call-graph=no/", "--filter", "next_pid != 0"],
}


def slowdown(args, work, exe, kind, base_dcpid=None):
    """One run of the unpaced ping-pong under `kind` (the collector starts, settles, and stops
    after the run): round trips per second."""
    d = perf = None
    if kind.startswith("dcpid") or kind == "base_dcpid+offcpu":
        base = kind == "base_dcpid+offcpu"
        exe_d = base_dcpid if base else None
        source = args.base_source if base else args.source
        if kind.startswith("dcpid+offcpu:"):
            source = kind.split(":", 1)[1]
        d = Dcpid(args, work, kind != "dcpid", exe_d, source)
        time.sleep(args.settle)
    elif kind in PERF_KINDS:
        data = os.path.join(work, "perf.data")
        perf = subprocess.Popen(
            ["perf", "record", "-a", "-g", *PERF_KINDS[kind], "-B", "-N", "-q", "-o", data],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.settle)
    try:
        return pingpong(exe, args.secs, 0, args.same_cpu)
    finally:
        if d:
            d.stop()
            shutil.rmtree(d.dir, ignore_errors=True)
        if perf:
            perf.send_signal(2)
            perf.wait(timeout=300)


def tree_bytes(d):
    n = 0
    for root, _, files in os.walk(d):
        for f in files:
            try:
                n += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return n


def write_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def bytes_run(args, work, exe):
    """Bytes per core-day with off-CPU on: two dcpid side by side on the same machine (off-CPU
    off and on, same options), the paced ping-pong running all along. Over the window (after
    --settle): each database's epochs/ growth (files' sizes; spool and binaries/ excluded) and each daemon's
    write_bytes (/proc/PID/io). Off-CPU's share is on - off; projected to a core-day linearly
    (x 86400 / window / CPUs): an upper bound, since the off-CPU profiles grow with distinct
    blocking sites, which saturate, and the slices' per-minute records are what keeps
    growing."""
    off = Dcpid(args, work, False)
    on = Dcpid(args, work, True, None, args.source)
    pp = subprocess.Popen([exe, str(args.bytes_secs + args.settle + 30), str(args.rate)],
                          stdout=subprocess.DEVNULL)
    try:
        time.sleep(args.settle)
        # epochs/ only: binaries/ (the symbol store, issue 39) holds one table per image,
        # written when each daemon first samples it, at times that differ between the two
        # daemons, so counting it made on - off measure the store's timing, not off-CPU.
        db = {k: os.path.join(d.dir, "db", "epochs") for k, d in (("off", off), ("on", on))}
        t0 = time.time()
        b0 = {k: tree_bytes(v) for k, v in db.items()}
        w0 = {"off": write_bytes(off.p.pid), "on": write_bytes(on.p.pid)}
        time.sleep(args.bytes_secs)
        secs = time.time() - t0
        b1 = {k: tree_bytes(v) for k, v in db.items()}
        w1 = {"off": write_bytes(off.p.pid), "on": write_bytes(on.p.pid)}
        files, nfiles = on.off_cpu_bytes()
    finally:
        pp.kill()
        pp.wait()
        off.stop()
        on.stop()
    ncpu = os.cpu_count()
    day = 86400 / secs / ncpu
    grow = {k: b1[k] - b0[k] for k in b0}
    wr = {k: w1[k] - w0[k] for k in w0}
    out = {
        "window_s": secs,
        "db_growth_bytes": grow,
        "write_bytes": wr,
        "off_cpu_files_at_end": {"bytes": files, "files": nfiles},
        "off_cpu_db_growth_per_core_day_mb": (grow["on"] - grow["off"]) * day / 1e6,
        "off_cpu_write_bytes_per_core_day_mb": (wr["on"] - wr["off"]) * day / 1e6,
        "db_growth_per_core_day_mb": {k: v * day / 1e6 for k, v in grow.items()},
    }
    for d in (off, on):
        shutil.rmtree(d.dir, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--rate", type=float, default=5000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--settle", type=float, default=8)
    ap.add_argument("--cost-settle", type=float,
                    help="--settle of the cost runs only (default: --settle)")
    ap.add_argument("--dcpid", default=os.path.join(ROOT, "target", "release", "dcpid"))
    ap.add_argument("--dcpictl", default=os.path.join(ROOT, "target", "release", "dcpictl"))
    ap.add_argument("--base-dcpid")
    ap.add_argument("--source", help="dcpid's --off-cpu-source (default: its own default)")
    ap.add_argument("--base-source", help="the base run's --off-cpu-source; with it and no "
                    "--base-dcpid, the base is --dcpid itself with this source")
    ap.add_argument("--sources", help="comma-separated --off-cpu-source values whose cost is "
                    "measured side by side (and slowdown kinds dcpid+offcpu:SRC)")
    ap.add_argument("--cost-reps", type=int, default=1)
    ap.add_argument("--no-slowdown", action="store_true")
    ap.add_argument("--callchains", default="fp",
                    help="dcpid's --callchains (default fp; the shipped dcpid.toml has none)")
    ap.add_argument("--same-cpu", action="store_true",
                    help="slowdown runs with both ping-pong threads on CPU 0: every switch goes "
                    "from one thread to the other with no idle between, so the round trips are "
                    "bound by the CPU, the kernel's work at each switch included")
    ap.add_argument("--bytes-secs", type=float, default=0,
                    help="also measure bytes per core-day over this window (two dcpid)")
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--kinds", help="comma-separated collectors of the slowdown run (default: "
                    "none,dcpid,dcpid+offcpu (dcpid+offcpu:SRC for each of --sources)," +
                    ",".join(PERF_KINDS) + ")")
    ap.add_argument("--out")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="offcpu-bench-")
    exe = build(work)
    runs = {"off": [], "on": [], "base_on": []}
    sources = args.sources.split(",") if args.sources else []
    for src in sources:
        runs["on:" + src] = []
    for _ in range(0 if args.no_cost else args.cost_reps):
        runs["off"].append(cost(args, work, exe, False))
        if sources:
            for src in sources:
                runs["on:" + src].append(cost(args, work, exe, True, None, src))
            continue
        runs["on"].append(cost(args, work, exe, True, None, args.source))
        if args.base_dcpid or args.base_source:
            runs["base_on"].append(cost(args, work, exe, True, args.base_dcpid,
                                        args.base_source))
    res = {"cost_runs": runs}

    def extra(on_runs):
        # Medians over the repetitions; the extra CPU is on - off, per switch of the window.
        off = statistics.median(r["dcpid_cpu_pct"] for r in runs["off"])
        on = statistics.median(r["dcpid_cpu_pct"] for r in on_runs)
        sw = statistics.median(r["switches_per_s_per_cpu"] for r in on_runs) * os.cpu_count()
        ns = (on - off) / 100 * 1e9 / sw if sw else 0
        prog = [r for r in on_runs if "bpf_prog_ns_per_run" in r]
        return {
            **({"bpf_prog_ns_per_run": statistics.median(r["bpf_prog_ns_per_run"] for r in prog),
                "bpf_prog_cpu_pct": statistics.median(r["bpf_prog_cpu_pct"] for r in prog)}
               if prog else {}),
            "extra_cpu_pct_of_one_cpu": on - off,
            "switches_per_s_per_cpu": sw / os.cpu_count(),
            "extra_ns_per_switch": ns,
            "extra_cpu_pct_at_10k_per_cpu": ns * 10_000 * os.cpu_count() / 1e9 * 100,
            "offcpu_thread_ns_per_switch": statistics.median(
                r["offcpu_thread_ns_per_switch"] for r in on_runs),
        }

    res["cost"] = {"dcpid": extra(runs["on"])} if runs["on"] else {}
    for src in sources:
        if runs["on:" + src]:
            res["cost"]["dcpid:" + src] = extra(runs["on:" + src])
    if runs["base_on"]:
        res["cost"]["base_dcpid"] = extra(runs["base_on"])
    res["slowdown"] = {}
    kinds = args.kinds.split(",") if args.kinds else [
        "none", "dcpid", *(["dcpid+offcpu:" + src for src in sources] or ["dcpid+offcpu"]),
        *PERF_KINDS]
    if (args.base_dcpid or args.base_source) and "base_dcpid+offcpu" not in kinds:
        kinds.append("base_dcpid+offcpu")
    rts = {k: [] for k in kinds}
    # Interleaved (each rep runs every kind once), so that a change of the machine's load
    # during the run falls on every kind alike.
    for _ in range(0 if args.no_slowdown else args.reps):
        for kind in kinds:
            rts[kind].append(slowdown(args, work, exe, kind, args.base_dcpid))
    for kind, v in rts.items():
        if v:
            res["slowdown"][kind] = {"round_trips_per_s": v, "median": statistics.median(v)}
    if args.bytes_secs:
        res["bytes"] = bytes_run(args, work, exe)
    base = res["slowdown"].get("none", {}).get("median")
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
