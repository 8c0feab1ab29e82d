#!/usr/bin/env python3
"""Benchmarks of dcpid against `perf record -a`, side by side, on this machine.

Driven by bench/run.sh (which installs perf, builds the release binaries and the workloads).
Measures, interleaving configurations (none / dcpid / perf, rotated each repetition):

  slowdown   wall time of fixed CPU-bound and memory-bound workloads (2 copies, one per CPU)
             with no profiler, dcpid and perf record -a, at 1 kHz and 5 kHz per CPU
  collector  user+sys CPU of the collector process during the workload windows, and over
             its whole life (os.wait4 rusage)
  steady     one run compiling sqlite3.c with gcc (2 copies x 2 rounds) with dcpid AND perf
             record running at the same time (1 kHz each): disk bytes per hour, collector CPU,
             per-symbol accuracy in cc1 (dcpiprof vs perf report), report times, profile vs
             image size
  mix        known-proportion workload (f1/f2/f3 = 50/30/20 % of identical loop iterations),
             both profilers at once: shares vs ground truth
  churn      dcpid alone during fork+exec churn: peak RSS (VmHWM) and RSS over time
  report     dcpiprof over a synthetic 1-hour database and a simulated fleet
             (hosts x epochs x images profiles written through the profile-format crate)

Writes bench/results/<timestamp>.json and .md, prints the summary table.
Only the standard library is used.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST = "benchhost"

FULL = dict(
    reps=7,
    cpu_iters=600_000_000,  # ~1.4 s on the reference VM
    mem_mib=64,
    mem_steps=8_000_000,  # ~1.3 s on the reference VM
    rates=[1000, 5000],
    steady_rate=1000,
    cc_opt="-O2",  # steady run: 2 copies x 4 rounds of `cc -O2 -c sqlite3.c`
    steady_rounds=4,
    mix_iters=3_000_000_000,  # ~8 s
    churn_secs=480,
    churn_rate=5000,
    report_reps=3,
    fleet=(100, 24, 200),
    hour_images=200,
)
QUICK = dict(
    reps=1,
    cpu_iters=200_000_000,
    mem_mib=64,
    mem_steps=2_000_000,
    rates=[1000, 5000],
    steady_rate=1000,
    cc_opt="-O0",
    steady_rounds=2,
    mix_iters=700_000_000,
    churn_secs=15,
    churn_rate=5000,
    report_reps=1,
    fleet=(10, 4, 50),
    hour_images=200,
)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def period_ns(rate_hz):
    return 1_000_000_000 // rate_hz


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def proc_cpu_s(pid):
    """CPU time of a process in seconds, with ns resolution while it lives.

    utime+stime from /proc/PID/stat have a 10 ms tick resolution, too coarse for a collector
    that uses milliseconds per second; so the on-CPU time of every live thread is summed from
    /proc/PID/task/*/schedstat (ns, user+sys), plus the ticks of threads that already exited
    (stat counts them, the task list does not)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks_all = (int(fields[11]) + int(fields[12])) / CLK_TCK
    live_ns, live_ticks = 0, 0.0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    live_ns += int(f.read().split()[0])
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    tf = f.read().rsplit(")", 1)[1].split()
                live_ticks += (int(tf[11]) + int(tf[12])) / CLK_TCK
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return ticks_all
    return live_ns / 1e9 + max(0.0, ticks_all - live_ticks)


def proc_io(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                k, v = line.split(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def proc_mem_kib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0])
    return out


def tree_bytes(path):
    """(apparent bytes, allocated bytes, files) under path."""
    app = alloc = files = 0
    if os.path.isfile(path):
        st = os.stat(path)
        return st.st_size, st.st_blocks * 512, 1
    for d, _, fs in os.walk(path):
        for name in fs:
            try:
                st = os.lstat(os.path.join(d, name))
            except OSError:
                continue
            app += st.st_size
            alloc += st.st_blocks * 512
            files += 1
    return app, alloc, files


def med(xs):
    return statistics.median(xs) if xs else None


class ProfilerError(RuntimeError):
    pass


class Dcpid:
    kind = "dcpid"

    def __init__(self, bins, workdir, rate, max_secs):
        self.bins, self.rate = bins, rate
        self.dir = workdir
        self.db = os.path.join(workdir, "db")
        self.spool_dir = os.path.join(workdir, "spool")
        self.sock = os.path.join(workdir, "ctl.sock")
        self.log_path = os.path.join(workdir, "dcpid.log")
        self.max_secs = max_secs
        self.proc = None
        self.rusage = None

    def cmd(self):
        return [
            self.bins["dcpid"], "--config", "none", "--db", self.db,
            "--spool", os.path.join(self.spool_dir, "spool.db"), "--socket", self.sock,
            "--host", HOST, "-e", f"cpu-clock:{period_ns(self.rate)}",
            "--duration", f"{int(self.max_secs)}s",
        ]

    def ctl(self, *args, timeout=30):
        return run([self.bins["dcpictl"], "--socket", self.sock, *args], timeout=timeout)

    def start(self):
        os.makedirs(self.spool_dir, exist_ok=True)
        self.logf = open(self.log_path, "w")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.cmd(), stdout=self.logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ProfilerError(f"dcpid exited with {self.proc.returncode} before ready: "
                                    f"{' '.join(self.cmd())}\n{self.log_tail()}")
            if os.path.exists(self.sock):
                r = self.ctl("status", "--json", timeout=10)
                if r.returncode == 0:
                    self.ready_s = time.monotonic() - self.t_start
                    return
            time.sleep(0.05)
        self.kill()
        raise ProfilerError(f"dcpid not ready after 30 s (dcpictl status failing): "
                            f"{' '.join(self.cmd())}\n{self.log_tail()}")

    def status(self):
        r = self.ctl("status", "--json", timeout=10)
        if r.returncode != 0:
            return {"error": (r.stderr or r.stdout).strip()[-500:]}
        try:
            return json.loads(r.stdout)
        except ValueError as e:
            return {"error": f"bad JSON from dcpictl status --json: {e}"}

    def flush(self):
        t = time.monotonic()
        r = self.ctl("flush", timeout=120)
        if r.returncode != 0:
            raise ProfilerError(f"dcpictl flush failed ({r.returncode}): {r.stderr.strip()}")
        return time.monotonic() - t

    def cpu_s(self):
        return proc_cpu_s(self.proc.pid)

    def io(self):
        return proc_io(self.proc.pid)

    def disk(self):
        a1, b1, f1 = tree_bytes(self.db)
        a2, b2, f2 = tree_bytes(self.spool_dir)
        # Profiles grow with the samples; the rest of an epoch's host directory (kallsyms
        # snapshot, summary, markers) is written once per host and epoch.
        prof = 0
        for dirpath, _, fs in os.walk(self.db):
            for name in fs:
                if name.endswith(".prof"):
                    try:
                        prof += os.path.getsize(os.path.join(dirpath, name))
                    except OSError:
                        pass
        wal = 0
        for name in os.listdir(self.spool_dir) if os.path.isdir(self.spool_dir) else []:
            if name.endswith(("-wal", "-shm")):
                wal += os.path.getsize(os.path.join(self.spool_dir, name))
        return {"db_bytes": a1, "db_alloc": b1, "db_files": f1, "spool_bytes": a2,
                "spool_wal_shm_bytes": wal,
                "spool_alloc": b2, "total_bytes": a1 + a2, "total_alloc": b1 + b2,
                "profile_bytes": prof, "per_epoch_fixed_bytes": a1 - prof}

    def stop(self):
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        self._reap(t, 120)

    def _reap(self, t, timeout):
        deadline = time.monotonic() + timeout
        while True:
            pid, st, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(st)
                break
            if time.monotonic() > deadline:
                self.proc.kill()
                pid, st, ru = os.wait4(self.proc.pid, 0)
                self.proc.returncode = os.waitstatus_to_exitcode(st)
                self.logf.close()
                raise ProfilerError(f"{self.kind} did not exit within {timeout} s of SIGTERM/SIGINT"
                                    f"\n{self.log_tail()}")
            time.sleep(0.02)
        self.logf.close()
        self.stop_s = time.monotonic() - t
        self.rusage = {"user_s": ru.ru_utime, "sys_s": ru.ru_stime,
                       "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kib": ru.ru_maxrss}
        if self.proc.returncode not in (0, -signal.SIGINT, -signal.SIGTERM):
            raise ProfilerError(f"{self.kind} exited with {self.proc.returncode}\n{self.log_tail()}")

    def kill(self):
        if self.proc and self.proc.returncode is None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, n=15):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def prof(self, *args):
        return [self.bins["dcpiprof"], "--db", self.db, "--host", "all", "--epoch", "all", *args]


class Perf(Dcpid):
    kind = "perf"

    def __init__(self, bins, workdir, rate, max_secs):
        super().__init__(bins, workdir, rate, max_secs)
        self.data = os.path.join(workdir, "perf.data")
        self.log_path = os.path.join(workdir, "perf.log")

    def cmd(self):
        # -B -N: no build-id collection at exit and no copy of every hit binary into ~/.debug.
        # That makes perf cheaper (so the comparison is conservative for dcpid) and keeps
        # perf record alive on this machine: perf 6.1 aborted at exit ("assertion failed at
        # util/build-id.c:1010", "stack smashing detected") while reading the build-ids of
        # some binaries (other helpers' test programs) running at the same time. perf report
        # then reads build-ids from the files; it can hit the same abort (reported as an error).
        return [self.bins["perf"], "record", "-B", "-N", "-a", "-e", "cpu-clock", "-c",
                str(period_ns(self.rate)), "-o", self.data, "--", "sleep", str(int(self.max_secs))]

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        self.logf = open(self.log_path, "w")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(self.cmd(), stdout=self.logf, stderr=subprocess.STDOUT)
        # perf has no readiness signal: wait for the header and the synthesized side-band of
        # existing processes (the file stops being empty), then a fixed settle time.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ProfilerError(f"perf exited with {self.proc.returncode}\n{self.log_tail()}")
            if os.path.exists(self.data) and os.path.getsize(self.data) > 0:
                self.ready_s = time.monotonic() - self.t_start
                time.sleep(0.5)
                return
            time.sleep(0.05)
        self.kill()
        raise ProfilerError("perf record produced no output in 30 s")

    def status(self):
        return {}

    def stop(self):
        t = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        self._reap(t, 120)
        txt = self.log_tail(50)
        m = re.search(r"\(([\d,]+) samples\)", txt)
        self.samples = int(m.group(1).replace(",", "")) if m else None
        m = re.search(r"Processed \d+ events and lost (\d+) chunks", txt)
        self.lost_chunks = int(m.group(1)) if m else 0

    def disk(self):
        a, b, _ = tree_bytes(self.data)
        return {"total_bytes": a, "total_alloc": b}


class Bench:
    def __init__(self, args):
        self.args = args
        self.p = dict(QUICK if args.quick else FULL)
        if args.reps:
            self.p["reps"] = args.reps
        if args.churn_seconds:
            self.p["churn_secs"] = args.churn_seconds
        self.bins = {
            "dcpid": os.path.join(args.bin_dir, "dcpid"),
            "dcpictl": os.path.join(args.bin_dir, "dcpictl"),
            "dcpiprof": os.path.join(args.bin_dir, "dcpiprof"),
            "fleetgen": args.fleetgen,
            "perf": args.perf,
        }
        self.wl = os.path.abspath(args.workload_dir)
        self.stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.work = os.path.join(args.work, "run-" + self.stamp)
        self.cache = os.path.join(args.work, "cache")
        os.makedirs(self.work, exist_ok=True)
        os.makedirs(self.cache, exist_ok=True)
        self.res = {"mode": "quick" if args.quick else "full", "params": dict(self.p),
                    "started": self.stamp, "machine": machine_info(args), "errors": []}
        self.res["params"]["fleet"] = list(self.p["fleet"])
        self.seq = 0
        self.live = []  # profilers started, killed if a section fails

    def newdir(self, name):
        self.seq += 1
        d = os.path.join(self.work, f"{self.seq:03d}-{name}")
        os.makedirs(d, exist_ok=True)
        return d

    def profiler(self, kind, rate, max_secs, name):
        cls = {"dcpid": Dcpid, "perf": Perf}[kind]
        p = cls(self.bins, self.newdir(f"{name}-{kind}-{rate}"), rate, max_secs)
        self.live.append(p)
        return p

    # ---- workloads -------------------------------------------------------------------------

    def run_copies(self, argv_list):
        """Start the commands at once, wait for all; returns their stdout first fields."""
        procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for a in argv_list]
        outs = []
        for p, a in zip(procs, argv_list):
            o, e = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(a)} failed ({p.returncode}): {e.strip()}")
            outs.append(o.split())
        return outs

    def workload(self, name):
        if name == "cpu":
            argv = [os.path.join(self.wl, "cpu"), str(self.p["cpu_iters"])]
        elif name == "mem":
            argv = [os.path.join(self.wl, "mem"), str(self.p["mem_mib"]), str(self.p["mem_steps"])]
        else:
            raise ValueError(name)
        outs = self.run_copies([argv, argv])
        return statistics.mean(float(o[0]) for o in outs)

    # ---- 1 + 2: slowdown and collector CPU ------------------------------------------------

    def slowdown(self):
        configs = [("none", None)] + [(k, r) for r in self.p["rates"] for k in ("dcpid", "perf")]
        times = {f"{k}@{r}" if r else k: {"cpu": [], "mem": []} for k, r in configs}
        window = {f"{k}@{r}": {"cpu_s": 0.0, "wall_s": 0.0, "lifetime_cpu_s": [], "life_wall_s": [],
                               "status": [], "samples": []} for k, r in configs if r}
        for rep in range(self.p["reps"]):
            order = configs[rep % len(configs):] + configs[:rep % len(configs)]
            for kind, rate in order:
                key = f"{kind}@{rate}" if rate else kind
                log(f"slowdown rep {rep + 1}/{self.p['reps']}: {key}")
                prof = None
                if kind != "none":
                    prof = self.profiler(kind, rate, 600, "slowdown")
                    prof.start()
                    t0, c0 = time.monotonic(), prof.cpu_s()
                for wl in ("cpu", "mem"):
                    times[key][wl].append(self.workload(wl))
                if prof:
                    c1, t1 = prof.cpu_s(), time.monotonic()
                    w = window[key]
                    w["cpu_s"] += c1 - c0
                    w["wall_s"] += t1 - t0
                    st = prof.status()
                    prof.stop()
                    w["lifetime_cpu_s"].append(prof.rusage["cpu_s"])
                    w["life_wall_s"].append(prof.stop_s + (t1 - prof.t_start))
                    w["status"].append(st)
                    if kind == "perf":
                        w["samples"].append(prof.samples)
                    shutil.rmtree(prof.dir, ignore_errors=True)
        out = {"times_s": times, "median_s": {}, "ratio_vs_none": {}, "collector": {}}
        for key, d in times.items():
            out["median_s"][key] = {wl: med(v) for wl, v in d.items()}
            out.setdefault("min_s", {})[key] = {wl: min(v) for wl, v in d.items()}
        base = out["median_s"]["none"]
        for key, m in out["median_s"].items():
            if key != "none":
                out["ratio_vs_none"][key] = {wl: m[wl] / base[wl] for wl in m}
        for key, w in window.items():
            out["collector"][key] = {
                "window_cpu_s": w["cpu_s"], "window_wall_s": w["wall_s"],
                "window_cpu_frac": w["cpu_s"] / w["wall_s"] if w["wall_s"] else None,
                "lifetime_cpu_s_median": med(w["lifetime_cpu_s"]),
                "lifetime_wall_s_median": med(w["life_wall_s"]),
                "last_status": w["status"][-1] if w["status"] else None,
                "perf_samples": w["samples"],
            }
        self.res["slowdown"] = out

    # ---- 2 + 3 + 5b + 6 (part): steady compile run with both profilers -----------------

    def sqlite_source(self):
        """sqlite3.c of the bundled libsqlite3-sys crate, fetched when dcpid is built."""
        import glob

        home = os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo"))
        found = sorted(glob.glob(os.path.join(home, "registry/src/*/libsqlite3-sys-*/sqlite3/sqlite3.c")))
        if not found:
            raise RuntimeError(f"no sqlite3.c under {home}/registry/src (build dcpid first)")
        return found[-1]

    def both(self, name, rate, fn):
        """Run fn() with dcpid and perf record -a sampling at the same time."""
        d = self.profiler("dcpid", rate, 3600, name)
        p = self.profiler("perf", rate, 3600, name)
        d.start()
        p.start()
        snap0 = self.snapshot(d, p)
        extra = fn(d, p)
        snap1 = self.snapshot(d, p)
        d_status = d.status()
        # Make dcpid publish what it has so the db size includes everything before stopping.
        flush_s = d.flush()
        snap2 = self.snapshot(d, p)
        p.stop()
        d.stop()
        return d, p, {"snap0": snap0, "snap1": snap1, "after_flush": snap2, "flush_s": flush_s,
                      "dcpid_status": d_status, "extra": extra}

    def snapshot(self, d, p):
        return {"t": time.monotonic(), "dcpid_cpu_s": d.cpu_s(), "perf_cpu_s": p.cpu_s(),
                "dcpid_io": d.io(), "perf_io": p.io(), "dcpid_disk": d.disk(),
                "perf_disk": p.disk()}

    def steady(self):
        src = self.sqlite_source()
        rate = self.p["steady_rate"]
        cc1 = os.path.realpath(run(["cc", "-print-prog-name=cc1"]).stdout.strip())
        mids = {}

        def work(d, p):
            # N rounds per CPU; the forced flush after half of them starts the interval over
            # which the steady-state growth of the database is measured.
            t = time.monotonic()
            rounds = self.p["steady_rounds"]
            for rnd in range(rounds):
                procs = [subprocess.Popen(["cc", self.p["cc_opt"], "-w", "-c", src, "-o",
                                           os.path.join(d.dir, f"sqlite-{i}.o")])
                         for i in range(2)]
                if any(pr.wait() != 0 for pr in procs):
                    raise RuntimeError("cc failed")
                if rnd == rounds // 2 - 1:
                    d.flush()
                    mids["half"] = self.snapshot(d, p)
            return {"wall_s": time.monotonic() - t}

        log(f"steady: 2 copies x {self.p['steady_rounds']} rounds of cc {self.p['cc_opt']} -c sqlite3.c, "
            f"dcpid + perf at {rate} Hz")
        d, p, r = self.both("steady", rate, work)
        s0, s1, sf, h = r["snap0"], r["snap1"], r["after_flush"], mids["half"]
        wall = s1["t"] - s0["t"]
        out = {"rate_hz": rate, "window_s": wall, "work_wall_s": r["extra"]["wall_s"],
               "workload": f"2 copies x {self.p['steady_rounds']} rounds of cc {self.p['cc_opt']} -w -c {src}",
               "dcpid_status": r["dcpid_status"], "perf_samples": p.samples,
               "perf_lost_chunks": p.lost_chunks}
        dc, pc = s1["dcpid_cpu_s"] - s0["dcpid_cpu_s"], s1["perf_cpu_s"] - s0["perf_cpu_s"]
        out["collector"] = {"dcpid_window_cpu_s": dc, "perf_window_cpu_s": pc,
                            "ratio_window": dc / pc if pc else None,
                            "dcpid_lifetime": d.rusage, "perf_lifetime": p.rusage,
                            "ratio_lifetime": d.rusage["cpu_s"] / p.rusage["cpu_s"]
                            if p.rusage["cpu_s"] else None}
        # Disk. Steady state = from just after the forced mid-run flush (everything published)
        # to just after the final forced flush; growth extrapolated linearly to one hour, which
        # is pessimistic for dcpid (profiles stop growing once the hot PCs are known).
        dd, pd = d.disk(), p.disk()
        dt = sf["t"] - h["t"]
        g = sf["dcpid_disk"]["total_bytes"] - h["dcpid_disk"]["total_bytes"]
        pg = s1["perf_disk"]["total_bytes"] - h["perf_disk"]["total_bytes"]
        disk = {"dcpid_final": dd, "perf_final_bytes": pd["total_bytes"],
                "perf_bytes_per_hour": (s1["perf_disk"]["total_bytes"] - s0["perf_disk"]["total_bytes"])
                * 3600.0 / wall,
                "perf_steady_growth_per_hour": pg * 3600.0 / (s1["t"] - h["t"]),
                "dcpid_steady_growth_bytes": g, "dcpid_steady_interval_s": dt,
                "dcpid_steady_growth_per_hour": max(g, 0) * 3600.0 / dt}
        disk["ratio_perf_over_dcpid_steady_growth"] = (
            disk["perf_steady_growth_per_hour"] / disk["dcpid_steady_growth_per_hour"] if g > 0 else None)
        # The same without the once-per-epoch files (written at the first publish, which may
        # fall inside the interval): growth of profiles + spool only...
        gv = (sf["dcpid_disk"]["profile_bytes"] + sf["dcpid_disk"]["spool_bytes"]
              - h["dcpid_disk"]["profile_bytes"] - h["dcpid_disk"]["spool_bytes"])
        disk["dcpid_variable_growth_bytes"] = gv
        disk["dcpid_variable_growth_per_hour"] = max(gv, 0) * 3600.0 / dt
        # ...and a pessimistic hour: a new epoch every hour (its fixed files) + that growth.
        disk["dcpid_per_epoch_fixed_bytes"] = dd["per_epoch_fixed_bytes"]
        disk["dcpid_hour_with_new_epoch"] = dd["per_epoch_fixed_bytes"] + disk["dcpid_variable_growth_per_hour"]
        disk["ratio_perf_over_dcpid_variable_growth"] = (
            disk["perf_steady_growth_per_hour"] / disk["dcpid_variable_growth_per_hour"] if gv > 0 else None)
        disk["ratio_perf_over_dcpid_hour_with_new_epoch"] = (
            disk["perf_steady_growth_per_hour"] / disk["dcpid_hour_with_new_epoch"])
        # Write volume at the default intervals: what dcpid wrote between the two forced
        # flushes (natural 2 s spool flushes), plus one rewrite of every published profile per
        # 60 s publish interval (an upper bound: only changed profiles are rewritten).
        w = s1["dcpid_io"].get("wchar", 0) - h["dcpid_io"].get("wchar", 0)
        disk["dcpid_spool_wchar_per_hour"] = w * 3600.0 / (s1["t"] - h["t"])
        disk["dcpid_write_volume_per_hour_est"] = disk["dcpid_spool_wchar_per_hour"] + 60 * dd["db_bytes"]
        disk["ratio_perf_over_dcpid_write_volume"] = (
            disk["perf_bytes_per_hour"] / disk["dcpid_write_volume_per_hour_est"]
            if disk["dcpid_write_volume_per_hour_est"] else None)
        disk["snapshots"] = {"start": s0["dcpid_disk"], "mid_after_flush": h["dcpid_disk"],
                             "end_before_flush": s1["dcpid_disk"], "end_after_flush": sf["dcpid_disk"],
                             "after_exit": dd}
        out["disk"] = disk
        out["profile_vs_image"] = self.profile_vs_image(d, [cc1])
        out["accuracy"] = self.compare_symbols(d, p, cc1, top=10)
        out["report_times"] = self.report_times(d, p, cc1)
        self.res["steady"] = out
        self.keep_small(d, p)

    def keep_small(self, d, p):
        if not self.args.keep:
            for x in (d, p):
                if x.kind == "perf":
                    os.unlink(x.data)

    # ---- accuracy helpers -----------------------------------------------------------------

    def dcpi_symbols(self, d, image):
        r = run(d.prof("--image", image, "--format", "json"), timeout=300)
        if r.returncode != 0:
            raise ProfilerError(f"dcpiprof --image {image} failed ({r.returncode}): "
                                f"{' '.join(d.prof('--image', image, '--format', 'json'))}\n"
                                f"{r.stderr.strip()[-800:]}")
        j = json.loads(r.stdout)
        tot = sum(int(row["samples"]) for row in j["rows"]) or 1
        return {row["symbol"]: int(row["samples"]) for row in j["rows"]}, tot, j

    def perf_symbols(self, p, image):
        base = os.path.basename(image)
        r = run([self.bins["perf"], "report", "--stdio", "-i", p.data, "--sort", "dso,sym", "-n", "-q",
                 "--percentage", "absolute"], timeout=600)
        if r.returncode != 0:
            raise ProfilerError(f"perf report failed: {r.stderr.strip()[-800:]}")
        syms, total = {}, 0
        for line in r.stdout.splitlines():
            m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.*\S)\s*$", line)
            if not m:
                continue
            total += int(m.group(1))
            if m.group(2) != base:
                continue
            syms[m.group(4)] = syms.get(m.group(4), 0) + int(m.group(1))
        if p.samples is None:  # perf record -B does not print its sample count
            p.samples = total
        return syms, sum(syms.values()) or 1

    def compare_symbols(self, d, p, image, top):
        try:
            ds, dt, _ = self.dcpi_symbols(d, image)
        except Exception as e:  # noqa: BLE001 - recorded, benchmark goes on
            self.error(f"accuracy {image}: {e}")
            return {"error": str(e)}
        try:
            ps, pt = self.perf_symbols(p, image)
        except Exception as e:  # noqa: BLE001
            self.error(f"accuracy {image} (perf side): {e}")
            return {"error": str(e)}
        # perf and dcpiprof may print C++ names with or without parameter lists: compare on
        # the name up to the parameter list.
        ds, ps = fold_names(ds), fold_names(ps)
        # Addresses perf could not name (printed as 0x...) are bucketed differently by the
        # two tools; compare named symbols only and report the unnamed share.
        unnamed = sum(c for n, c in ps.items() if n.startswith("0x"))
        names = sorted((n for n in ps if not n.startswith("0x")), key=lambda s: -ps[s])[:top]
        rows = []
        for s in names:
            a, b = 100.0 * ps[s] / pt, 100.0 * ds.get(s, 0) / dt
            rows.append({"symbol": s, "perf_pct": a, "dcpi_pct": b, "diff_pp": b - a})
        return {"image": image, "perf_samples": pt, "dcpi_samples": dt, "rows": rows,
                "perf_unnamed_pct": 100.0 * unnamed / pt,
                "max_abs_diff_pp": max((abs(r["diff_pp"]) for r in rows), default=None),
                "dcpi_only_top": sorted(ds, key=lambda s: -ds[s])[:top]}

    def mix(self):
        rate = self.p["steady_rate"]
        exe = os.path.join(self.wl, "mix")
        log(f"mix: 2 x mix (f1/f2/f3 = 50/30/20), dcpid + perf at {rate} Hz")

        def work(d, p):
            outs = self.run_copies([[exe, str(self.p["mix_iters"])]] * 2)
            return {"wall_s": max(float(o[0]) for o in outs)}

        d, p, r = self.both("mix", rate, work)
        truth = {"f1": 50.0, "f2": 30.0, "f3": 20.0}
        out = {"rate_hz": rate, "truth_pct": truth, "wall_s": r["extra"]["wall_s"]}
        try:
            ds, _, _ = self.dcpi_symbols(d, exe)
            dtot = sum(ds.get(f, 0) for f in truth) or 1
            out["dcpi_pct"] = {f: 100.0 * ds.get(f, 0) / dtot for f in truth}
            out["dcpi_samples_f123"] = dtot
            out["dcpi_max_abs_err_pp"] = max(abs(out["dcpi_pct"][f] - truth[f]) for f in truth)
        except Exception as e:  # noqa: BLE001
            self.error(f"mix dcpiprof: {e}")
        try:
            ps, _ = self.perf_symbols(p, exe)
        except Exception as e:  # noqa: BLE001
            self.error(f"mix perf report: {e}")
            ps = {}
        ptot = sum(ps.get(f, 0) for f in truth) or 1
        out["perf_pct"] = {f: 100.0 * ps.get(f, 0) / ptot for f in truth}
        out["perf_samples_f123"] = ptot
        out["perf_max_abs_err_pp"] = max(abs(out["perf_pct"][f] - truth[f]) for f in truth)
        out["report_times_small"] = self.report_times(d, p, exe, reps=1)
        self.res["mix"] = out
        self.keep_small(d, p)

    # ---- profile size vs image size -------------------------------------------------------

    def profile_vs_image(self, d, images):
        rows = []
        for img in images:
            bid = build_id(img)
            if not bid:
                continue
            files = []
            for dirpath, _, fs in os.walk(d.db):
                files += [os.path.join(dirpath, f) for f in fs if f.startswith("b" + bid)]
            rows.append({"image": img, "image_bytes": os.path.getsize(img), "build_id": bid,
                         "profile_files": [os.path.relpath(f, d.db) for f in files],
                         "profile_bytes": sum(os.path.getsize(f) for f in files)})
        return rows

    # ---- 6: report times ------------------------------------------------------------------

    def timed(self, cmd, reps, timeout=900):
        ts = []
        for _ in range(reps):
            t = time.monotonic()
            r = run(cmd, timeout=timeout)
            ts.append(time.monotonic() - t)
            if r.returncode != 0:
                raise ProfilerError(f"{' '.join(cmd)} failed ({r.returncode}): "
                                    f"{r.stderr.strip()[-800:]}")
        return {"median_s": med(ts), "all_s": ts, "stdout_bytes": len(r.stdout)}

    def report_times(self, d, p, image, reps=None):
        reps = reps or self.p["report_reps"]
        out = {"perf_data_bytes": os.path.getsize(p.data), "perf_samples": p.samples}
        jobs = {
            "dcpiprof_images": d.prof("--format", "json"),
            "dcpiprof_symbols": d.prof("--image", image, "--format", "json"),
            "perf_report_dso": [self.bins["perf"], "report", "--stdio", "-i", p.data, "--sort", "dso"],
            "perf_report_sym": [self.bins["perf"], "report", "--stdio", "-i", p.data, "--sort", "dso,sym"],
        }
        for k, cmd in jobs.items():
            try:
                out[k] = self.timed(cmd, reps)
            except Exception as e:  # noqa: BLE001
                self.error(f"report time {k}: {e}")
                out[k] = {"error": str(e)}
        return out

    def fleet_images(self):
        path = os.path.join(self.cache, "images.tsv")
        if not os.path.exists(path):
            write_image_list(path, 200)
        return path

    def gen_db(self, name, hosts, epochs, images, samples, max_offsets):
        stamp = (f"{name}-{hosts}x{epochs}x{images}-{samples}-{max_offsets}-"
                 f"{tree_rev('profile-format')}-{tree_rev('bench/fleetgen')}")
        out = os.path.join(self.cache, stamp)
        info = os.path.join(out + ".json")
        if os.path.exists(info):
            with open(info) as f:
                return out, json.load(f)
        shutil.rmtree(out, ignore_errors=True)
        for old in os.listdir(self.cache):  # previous versions of this db: large, drop them
            if old.startswith(name + "-"):
                p = os.path.join(self.cache, old)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
        t = time.monotonic()
        r = run([self.bins["fleetgen"], "--out", out, "--images", self.fleet_images(),
                 "--hosts", str(hosts), "--epochs", str(epochs), "--images-per-host", str(images),
                 "--samples-per-host-epoch", str(samples), "--max-offsets", str(max_offsets)],
                timeout=3600)
        if r.returncode != 0:
            raise RuntimeError(f"fleetgen failed: {r.stderr.strip()}")
        meta = json.loads(r.stdout)
        meta["gen_s"] = time.monotonic() - t
        meta["disk"] = dict(zip(("bytes", "alloc", "files"), tree_bytes(out)))
        with open(info, "w") as f:
            json.dump(meta, f)
        return out, meta

    def report(self):
        out = {}
        with open(self.fleet_images()) as f:
            first_image = f.readline().rstrip("\n").split("\t")[3]
        hour_samples = 2 * 3600 * 1000  # 2 CPUs busy for one hour at 1 kHz
        h, e, i = self.p["fleet"]
        # The 1-hour db is one busy host: up to 50000 distinct offsets in its hottest image
        # (~295k in all); fleet hosts are lighter: up to 4000 (~24k per host and epoch).
        for name, (nh, ne, ni, mo) in (("hour", (1, 1, self.p["hour_images"], 50000)),
                                       ("fleet", (h, e, i, 4000))):
            log(f"report: generating/using {name} db {nh} hosts x {ne} epochs x {ni} images")
            try:
                db, meta = self.gen_db(name, nh, ne, ni, hour_samples, mo)
            except Exception as e:  # noqa: BLE001
                self.error(f"gen {name}: {e}")
                continue
            base = [self.bins["dcpiprof"], "--db", db, "--host", "all", "--epoch", "all"]
            o = {"hosts": nh, "epochs": ne, "images_per_host": ni, "max_offsets": mo, "db": meta,
                 "symbol_image": first_image}
            for k, cmd in (("images", base + ["--format", "json"]),
                           ("symbols", base + ["--image", first_image, "--format", "json"])):
                log(f"report: dcpiprof {name} {k}")
                try:
                    o[k] = self.timed(cmd, self.p["report_reps"] if name == "hour" else 1)
                except Exception as e:  # noqa: BLE001
                    self.error(f"dcpiprof {name} {k}: {e}")
                    o[k] = {"error": str(e)}
            out[name] = o
        self.res["report"] = out

    # ---- 4: memory under churn ------------------------------------------------------------

    def churn(self):
        secs = self.p["churn_secs"]
        rate = self.p["churn_rate"]
        d = self.profiler("dcpid", rate, secs + 600, "churn")
        d.start()
        log(f"churn: 2 x fork+exec /bin/true for {secs} s, dcpid at {rate} Hz")
        exe = os.path.join(self.wl, "churn")
        procs = [subprocess.Popen([exe, str(secs)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
        series = []
        t0 = time.monotonic()
        while any(pr.poll() is None for pr in procs):
            m = proc_mem_kib(d.proc.pid)
            m["t"] = time.monotonic() - t0
            m["cpu_s"] = d.cpu_s()
            if len(series) % 10 == 0:
                m["disk_total_bytes"] = d.disk()["total_bytes"]
            series.append(m)
            time.sleep(1.0)
        outs = [pr.communicate()[0].split() for pr in procs]
        st = d.status()
        m = proc_mem_kib(d.proc.pid)
        d.stop()
        execs = sum(int(o[0]) for o in outs)
        dur = max(float(o[1]) for o in outs)
        rss = [s["VmRSS"] for s in series]
        ts = [s["t"] for s in series]
        out = {"seconds": secs, "rate_hz": rate, "execs": execs, "exec_per_s": execs / dur,
               "vmhwm_kib": m["VmHWM"], "final_rss_kib": m["VmRSS"], "rusage_maxrss_kib":
               d.rusage["maxrss_kib"], "dcpid_cpu_s": d.rusage["cpu_s"], "status": st,
               "series": series[:: max(1, len(series) // 120)],
               "disk_series": [(s["t"], s["disk_total_bytes"]) for s in series if "disk_total_bytes" in s],
               "disk_after_exit": d.disk()}
        # Flatness: RSS slope over the second half (after warm-up), KiB per minute, and the
        # growth of the mean RSS from the second quarter to the last quarter.
        n = len(rss)
        if n >= 8:
            half_t, half_r = ts[n // 2:], rss[n // 2:]
            out["rss_slope_kib_per_min_2nd_half"] = slope(half_t, half_r) * 60
            q2 = statistics.mean(rss[n // 4: n // 2])
            q4 = statistics.mean(rss[3 * n // 4:])
            out["rss_mean_q2_kib"], out["rss_mean_q4_kib"] = q2, q4
        self.res["churn"] = out

    def error(self, msg):
        log("ERROR: " + msg)
        self.res["errors"].append(msg)

    def section(self, name, fn):
        t = time.monotonic()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one failing section must not lose the others
            self.error(f"{name}: {type(e).__name__}: {e}")
        finally:
            for p in self.live:
                p.kill()
            self.live = []
        self.res.setdefault("section_s", {})[name] = time.monotonic() - t

    def main(self):
        t = time.monotonic()
        self.res["machine"]["sysctl_before"] = sysctls()
        sections = {"slowdown": self.slowdown, "steady": self.steady, "mix": self.mix,
                    "churn": self.churn, "report": self.report}
        only = self.args.only.split(",") if self.args.only else list(sections)
        for name in only:
            self.section(name, sections[name])
            self.res["machine"]["loadavg_after_" + name] = os.getloadavg()
        self.res["machine"]["sysctl_after"] = sysctls()
        self.res["total_s"] = time.monotonic() - t
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.args.results, exist_ok=True)
        base = os.path.join(self.args.results, self.stamp + ("-quick" if self.args.quick else ""))
        with open(base + ".json", "w") as f:
            json.dump(self.res, f, indent=1, default=str)
        md = summary(self.res)
        with open(base + ".md", "w") as f:
            f.write(md)
        print(md)
        log(f"wrote {base}.json and {base}.md")
        return 1 if self.res["errors"] else 0


# ---- helpers ------------------------------------------------------------------------------

def fold_names(counts):
    out = {}
    for name, c in counts.items():
        key = name.split("(", 1)[0].strip() if not name.startswith("(") else name
        out[key] = out.get(key, 0) + c
    return out


def slope(xs, ys):
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def build_id(path):
    r = run(["readelf", "-n", path])
    m = re.search(r"Build ID: ([0-9a-f]+)", r.stdout)
    return m.group(1) if m else None


def write_image_list(path, n):
    """Real ELF files of this machine with a build-id and a .text section, largest first."""
    cands = []
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/bin", "/usr/sbin", "/usr/lib"):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            p = os.path.join(d, name)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            try:
                with open(p, "rb") as f:
                    if f.read(4) != b"\x7fELF":
                        continue
            except OSError:
                continue
            cands.append(p)
    rows = []
    for p in cands:
        r = run(["readelf", "-nSW", p])
        m = re.search(r"Build ID: ([0-9a-f]+)", r.stdout)
        t = re.search(r"\]\s+\.text\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", r.stdout)
        if m and t and int(t.group(2), 16) >= 4096:
            rows.append((int(t.group(2), 16), m.group(1), int(t.group(1), 16), p))
        if len(rows) >= 4 * n:
            break
    rows.sort(reverse=True)
    seen, out = set(), []
    for size, bid, off, p in rows:
        if bid not in seen and "\t" not in p and "\n" not in p:
            seen.add(bid)
            out.append(f"{bid}\t{off}\t{size}\t{p}\n")
    with open(path, "w") as f:
        f.writelines(out[:n])


def tree_rev(sub):
    r = run(["git", "-C", ROOT, "rev-parse", f"HEAD:{sub}"])
    dirty = run(["git", "-C", ROOT, "status", "--porcelain", sub]).stdout.strip()
    return (r.stdout.strip()[:10] or "nogit") + ("-dirty" if dirty else "")


def sysctls():
    out = {}
    for k in ("perf_event_max_sample_rate", "perf_cpu_time_max_percent", "perf_event_paranoid"):
        try:
            with open(f"/proc/sys/kernel/{k}") as f:
                out[k] = f.read().strip()
        except OSError:
            pass
    return out


def machine_info(args):
    def sh(cmd):
        try:
            return run(cmd).stdout.strip()
        except OSError:
            return ""
    mem = ""
    with open("/proc/meminfo") as f:
        mem = f.readline().split(":")[1].strip()
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"kernel": os.uname().release, "cpus": os.cpu_count(), "cpu_model": cpu, "mem": mem,
            "perf_version": sh([args.perf, "--version"]), "git": sh(["git", "-C", ROOT, "rev-parse", "HEAD"]),
            "git_dirty": bool(sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])),
            "loadavg_start": os.getloadavg(),
            "pmu": "present" if os.path.exists("/sys/bus/event_source/devices/cpu")
            else "none (software events only: cpu-clock)"}


# ---- summary ------------------------------------------------------------------------------

def fmt(x, spec=".3f"):
    if x is None:
        return "n/a"
    return format(x, spec)


def verdict(ok):
    return "met" if ok else "**MISSED**"


def summary(res):
    L = [f"# dcpi benchmark results ({res['mode']} mode, {res['started']})", ""]
    m = res["machine"]
    L.append(f"Machine: {m['cpus']} vCPU {m['cpu_model']}, {m['mem']}, kernel {m['kernel']}, "
             f"PMU: {m['pmu']}, {m['perf_version']}, git {m['git'][:12]}"
             f"{' (dirty)' if m['git_dirty'] else ''}; load average at start "
             f"{' '.join(f'{x:.2f}' for x in m['loadavg_start'])}; kernel.perf_event_max_sample_rate "
             f"{m.get('sysctl_before', {}).get('perf_event_max_sample_rate', '?')}.")
    L.append("")
    sd = res.get("slowdown")
    if sd:
        L += ["## 1. Slowdown (2 copies, median of %d; ratio = time / time without profiler)"
              % res["params"]["reps"], "",
              "| config | cpu-bound s (median) | ratio | memory-bound s (median) | ratio | "
              "cpu-bound min ratio | memory-bound min ratio |", "|---|---|---|---|---|---|---|"]
        mn = sd.get("min_s", {})
        for k, v in sd["median_s"].items():
            r = sd["ratio_vs_none"].get(k, {"cpu": 1.0, "mem": 1.0})
            mr = {wl: mn[k][wl] / mn["none"][wl] for wl in ("cpu", "mem")} if mn else {"cpu": None, "mem": None}
            L.append(f"| {k} | {fmt(v['cpu'])} | {fmt(r['cpu'])} | {fmt(v['mem'])} | {fmt(r['mem'])} | "
                     f"{fmt(mr['cpu'])} | {fmt(mr['mem'])} |")
        L.append("\n(min ratio: best run / best run without a profiler, less sensitive to other load)")
        L.append("")
        for rate in res["params"]["rates"]:
            dr, pr = sd["ratio_vs_none"].get(f"dcpid@{rate}"), sd["ratio_vs_none"].get(f"perf@{rate}")
            if dr and pr:
                for wl in ("cpu", "mem"):
                    ok = dr[wl] - 1 <= (pr[wl] - 1) + 0.005
                    L.append(f"- {rate} Hz {wl}: dcpid +{100 * (dr[wl] - 1):.1f}% vs perf "
                             f"+{100 * (pr[wl] - 1):.1f}% -> goal (dcpid <= perf, 0.5 pt tolerance) "
                             f"{verdict(ok)}")
        L.append("")
        L += ["## 2. Collector CPU during the slowdown windows (user+sys of the collector process)", "",
              "| config | CPU s / wall s in windows | lifetime CPU s (median per run) |", "|---|---|---|"]
        for k, v in sd["collector"].items():
            L.append(f"| {k} | {fmt(v['window_cpu_frac'], '.4f')} | {fmt(v['lifetime_cpu_s_median'])} |")
        for rate in res["params"]["rates"]:
            d, p = sd["collector"].get(f"dcpid@{rate}"), sd["collector"].get(f"perf@{rate}")
            if d and p and p["window_cpu_frac"]:
                r = d["window_cpu_frac"] / p["window_cpu_frac"]
                L.append(f"- {rate} Hz: dcpid/perf CPU ratio in windows {r:.3f} -> goal <= 0.25 "
                         f"{verdict(r <= 0.25)}")
        L.append("")
    st = res.get("steady")
    if st:
        c, dk = st["collector"], st["disk"]
        L += [f"## Steady run: {st['workload']}; dcpid and perf at {st['rate_hz']} Hz at the same time, "
              f"{st['window_s']:.1f} s window", ""]
        L.append(f"- 2. Collector CPU in the window: dcpid {c['dcpid_window_cpu_s']:.3f} s, perf "
                 f"{c['perf_window_cpu_s']:.3f} s, ratio {fmt(c['ratio_window'], '.2f')} -> goal <= 0.25 "
                 f"{verdict(c['ratio_window'] is not None and c['ratio_window'] <= 0.25)}; lifetime "
                 f"(start to exit, rusage) dcpid {c['dcpid_lifetime']['cpu_s']:.2f} s, perf "
                 f"{c['perf_lifetime']['cpu_s']:.2f} s, ratio {fmt(c['ratio_lifetime'], '.2f')}")
        sn = dk["snapshots"]
        mid, end, ex = sn["mid_after_flush"], sn["end_after_flush"], sn["after_exit"]
        dt = dk["dcpid_steady_interval_s"]
        L.append(f"- 3. Disk, perf: perf.data {dk['perf_final_bytes']} B at the end; "
                 f"{dk['perf_steady_growth_per_hour'] / 1e6:.1f} MB/h over the steady interval.")
        L.append(f"- 3. Disk, dcpid after exit: profiles {ex['profile_bytes']} B, per-epoch files (kallsyms "
                 f"snapshot, summary) {ex['per_epoch_fixed_bytes']} B, spool {ex['spool_bytes']} B "
                 f"(of which WAL/shm {ex['spool_wal_shm_bytes']} B).")
        L.append(f"- 3. Steady interval ({dt:.1f} s, from the forced mid-run flush to the forced final flush): "
                 f"profiles {end['profile_bytes'] - mid['profile_bytes']:+d} B, spool "
                 f"{end['spool_bytes'] - mid['spool_bytes']:+d} B (WAL/shm "
                 f"{end['spool_wal_shm_bytes'] - mid['spool_wal_shm_bytes']:+d} B), per-epoch files "
                 f"{end['per_epoch_fixed_bytes'] - mid['per_epoch_fixed_bytes']:+d} B.")
        rg = dk.get("ratio_perf_over_dcpid_steady_growth")
        L.append(f"- 3. db + spool growth extrapolated linearly: {dk['dcpid_steady_growth_per_hour'] / 1e6:.2f} MB/h; "
                 f"perf / dcpid {fmt(rg, '.0f') if rg else 'inf (no growth)'} -> goal >= 1000 "
                 f"{verdict(rg is None or rg >= 1000)}")
        pg = end["profile_bytes"] - mid["profile_bytes"]
        rp = dk["perf_steady_growth_per_hour"] / (pg * 3600.0 / dt) if pg > 0 else None
        L.append(f"- 3. Published profiles only: {max(pg, 0) * 3600.0 / dt / 1e3:.1f} kB/h; perf / dcpid "
                 f"{fmt(rp, '.0f') if rp else 'inf (no growth)'}")
        re_ = dk.get("ratio_perf_over_dcpid_hour_with_new_epoch")
        rw = dk.get("ratio_perf_over_dcpid_write_volume")
        L.append(f"- 3. With a new epoch every hour (its kallsyms snapshot + summary counted once per hour): "
                 f"perf / dcpid {fmt(re_, '.0f')}. Write volume (spool writes + every profile rewritten "
                 f"each 60 s publish, an upper bound): {dk['dcpid_write_volume_per_hour_est'] / 1e6:.1f} MB/h, "
                 f"perf / dcpid {fmt(rw, '.1f')}")
        for row in st.get("profile_vs_image", []):
            L.append(f"- Profile size vs image: {row['image']} {row['image_bytes']} B, profile(s) "
                     f"{row['profile_bytes']} B ("
                     + (f"{row['image_bytes'] / row['profile_bytes']:.1f}x smaller)"
                        if row["profile_bytes"] else "no profile found)"))
        for key in ("accuracy",):
            a = st.get(key, {})
            if "rows" in a:
                L += ["", f"### 5b. Per-symbol shares within {a['image']} (perf {a['perf_samples']} "
                      f"samples, dcpi {a['dcpi_samples']})", "",
                      "| symbol | perf % | dcpi % | diff pp |", "|---|---|---|---|"]
                for r in a["rows"]:
                    L.append(f"| {r['symbol']} | {r['perf_pct']:.2f} | {r['dcpi_pct']:.2f} | "
                             f"{r['diff_pp']:+.2f} |")
                L.append(f"\n(perf could not name {a['perf_unnamed_pct']:.1f}% of the image's samples; "
                         f"compared over named symbols only)")
                mx = a["max_abs_diff_pp"]
                L.append(f"\nmax |diff| = {fmt(mx, '.2f')} pp -> goal <= 2 pp "
                         f"{verdict(mx is not None and mx <= 2)}")
            elif a:
                L.append(f"- {key}: ERROR {a.get('error', '')[:300]}")
        L.append("")
    mx = res.get("mix")
    if mx:
        L += ["## 5a. Known proportions (f1/f2/f3 = 50/30/20 % of iterations)", "",
              "| fn | truth % | dcpi % | perf % |", "|---|---|---|---|"]
        for f in ("f1", "f2", "f3"):
            L.append(f"| {f} | {mx['truth_pct'][f]:.1f} | {fmt(mx.get('dcpi_pct', {}).get(f), '.2f')} | "
                     f"{fmt(mx['perf_pct'][f], '.2f')} |")
        e = mx.get("dcpi_max_abs_err_pp")
        L.append(f"\nmax |error| dcpi {fmt(e, '.2f')} pp, perf {fmt(mx['perf_max_abs_err_pp'], '.2f')} "
                 f"pp -> goal <= 2 pp {verdict(e is not None and e <= 2)}")
        L.append("")
    ch = res.get("churn")
    if ch:
        hwm = ch["vmhwm_kib"] / 1024
        L += ["## 4. Daemon memory under process churn", "",
              f"- {ch['seconds']} s of 2 x fork+exec /bin/true: {ch['execs']} execs "
              f"({ch['exec_per_s']:.0f}/s), dcpid at {ch['rate_hz']} Hz",
              f"- Peak RSS (VmHWM) {hwm:.1f} MiB, final RSS {ch['final_rss_kib'] / 1024:.1f} MiB "
              f"-> goal <= 20 MiB {verdict(hwm <= 20)}"]
        if "rss_slope_kib_per_min_2nd_half" in ch:
            L.append(f"- Flatness: RSS slope over the 2nd half {ch['rss_slope_kib_per_min_2nd_half']:+.1f} "
                     f"KiB/min; mean RSS 2nd quarter {ch['rss_mean_q2_kib'] / 1024:.2f} MiB, last quarter "
                     f"{ch['rss_mean_q4_kib'] / 1024:.2f} MiB")
        L.append(f"- dcpid CPU over the churn run: {ch['dcpid_cpu_s']:.1f} s "
                 f"({100 * ch['dcpid_cpu_s'] / ch['seconds']:.1f}% of one CPU)")
        ds = ch.get("disk_series") or []
        if len(ds) >= 2:
            L.append(f"- db + spool during churn: {ds[0][1]} B at {ds[0][0]:.0f} s, {ds[-1][1]} B at "
                     f"{ds[-1][0]:.0f} s; after exit {ch['disk_after_exit']['total_bytes']} B")
        L.append("")
    rep = res.get("report")
    st_rt = (st or {}).get("report_times")
    if rep or st_rt:
        L += ["## 6. Report time", "", "| what | data | seconds |", "|---|---|---|"]
        if st_rt:
            L.append(f"| dcpiprof per-image | steady run db | {fmt((st_rt.get('dcpiprof_images') or {}).get('median_s'))} |")
            L.append(f"| dcpiprof per-symbol | steady run db | {fmt((st_rt.get('dcpiprof_symbols') or {}).get('median_s'))} |")
            L.append(f"| perf report --sort dso | steady perf.data {st_rt['perf_data_bytes'] / 1e6:.1f} MB | "
                     f"{fmt((st_rt.get('perf_report_dso') or {}).get('median_s'))} |")
            L.append(f"| perf report --sort dso,sym | same | {fmt((st_rt.get('perf_report_sym') or {}).get('median_s'))} |")
            ex = extrapolate_perf(res)
            if ex:
                L.append(f"| perf report --sort dso,sym, 1 h at 1 kHz x 2 CPUs (extrapolated, "
                         f"{ex['hour_bytes'] / 1e6:.0f} MB) | steady run scaled by samples | {ex['hour_s']:.1f} |")
        for name in ("hour", "fleet"):
            o = (rep or {}).get(name)
            if not o:
                continue
            data = (f"{o['hosts']} host(s) x {o['epochs']} epoch(s) x {o['images_per_host']} images, "
                    f"{o['db']['profiles']} profiles, {o['db']['disk']['bytes'] / 1e6:.1f} MB")
            for k in ("images", "symbols"):
                L.append(f"| dcpiprof {'per-image' if k == 'images' else 'per-symbol'} ({name}) | "
                         f"{data} | {fmt((o.get(k) or {}).get('median_s'))} |")
        L.append("")
    if res["errors"]:
        L += ["## Errors", ""] + [f"- {e[:1500]}" for e in res["errors"]] + [""]
    L.append(f"Total benchmark time {res['total_s']:.0f} s; per section: "
             + ", ".join(f"{k} {v:.0f} s" for k, v in res.get("section_s", {}).items()))
    return "\n".join(L) + "\n"


def extrapolate_perf(res):
    """perf report time for one hour of 2 busy CPUs at 1 kHz: the steady run's time scaled by
    the sample count (perf report's work is per sample; its fixed start-up cost makes this a
    slight overestimate)."""
    rt = (res.get("steady") or {}).get("report_times") or {}
    t = (rt.get("perf_report_sym") or {}).get("median_s")
    n = rt.get("perf_samples")
    if not t or not n:
        return None
    hour = 2 * 3600 * 1000
    return {"hour_bytes": rt["perf_data_bytes"] * hour / n, "hour_s": t * hour / n}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="~1 minute smoke run (1 repetition, short runs)")
    ap.add_argument("--only", help="comma-separated sections: slowdown,steady,mix,churn,report")
    ap.add_argument("--reps", type=int, help="repetitions of the slowdown measurement")
    ap.add_argument("--churn-seconds", type=int, help="length of the churn run")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--fleetgen", default=os.path.join(ROOT, "target", "release", "dcpi-fleetgen"))
    ap.add_argument("--workload-dir", default=os.path.join(BENCH, "workloads", "bin"))
    ap.add_argument("--perf", default=shutil.which("perf") or "/usr/bin/perf")
    ap.add_argument("--work", default="/var/tmp/dcpi-bench", help="scratch dir (and cache/)")
    ap.add_argument("--results", default=os.path.join(BENCH, "results"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch databases and perf.data")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench.py: must run as root (system-wide profiling)", file=sys.stderr)
        return 2
    return Bench(args).main()


if __name__ == "__main__":
    sys.exit(main())
