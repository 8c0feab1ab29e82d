#!/usr/bin/env python3
"""Storage of time slices (issue 36 item 2): database bytes per core-day with minute slices on
and off, side by side, on the busy mix.

Busy mix: a `cc -O2` loop over bench/workloads/*.c, a Python loop, and an exec churn loop
(`/bin/true` run back to back). Two dcpid sample it at the same time at the same rate (1 kHz
per CPU, cpu-clock), each into its own database: one with the defaults (`slice_interval` 1m,
`slice_rollup_after` 6h), one with `--slice-interval 0` (epoch totals only).

The spools go on a tmpfs (--spool-parent, /dev/shm by default), as in production: the
systemd unit's RuntimeDirectory puts the spool under /run/dcpid (README "Files"), and tmpfs
pages are neither disk writes nor counted by write_bytes. The daemons' logs go there too: under
systemd dcpid logs to the journal, not to a file it writes itself. Symbol tables (db/binaries/) and
the kallsyms snapshot (db/kallsyms/) are written once per build-id or kernel, not per day:
they are counted apart from the database growth, the projection and the bytes written (their
allocated blocks are subtracted from write_bytes; a file written once dirties them once).

Measured over the window (after a warm-up):
  * the growth of each database, and of the slices-on database's `slices.log`;
  * every record of `slices.log` (bytes, pairs, samples), read back after the stop by
    `cargo run -p dcpi-profile-format --example slices_stat`, and the size of the
    window's minutes rolled up into hour slices;
  * the daemon's CPU time spent on slices (its debug log line per appended slice);
  * bytes written (/proc/PID/io write_bytes) by each dcpid, and with --perf, beside them, the
    growth of a `perf record -a -B -N` at the same rate (the issue's "Writes" figure).

Projection to a core-day (stated in the output): a day-long epoch keeps its last 6 h as minute
slices and the 18 h before as hour slices, so at the end of the day

    slice files = 360 x (mean bytes of a minute record) + 18 x (bytes of an hour record)

where an hour record is the window's minutes rolled up into one, scaled linearly to 60 minutes
(an upper bound: distinct (image, offset) pairs saturate, issue 36); the epoch totals grow by
the slices-off database's growth rate over the second half of the window, linearly for 24 h
(also an upper bound). Both divided by the number of CPUs. The slices-off daemon is flushed
(`dcpictl flush`) before each snapshot, so that its database holds every sample so far and its
growth is the totals' own, not the publish schedule's steps (--no-flush-off: the old way).

Writes: in the first 6 h of an epoch slices cost their appends (measured: write_bytes of the
slices-on dcpid against the slices-off one); after that, each hour also appends one hour record
to slices.hours.log (the roll-up; the hour's minute segment is unlinked, nothing rewritten,
FORMAT.md §14.5), so the projected hourly writes then add one projected hour record.
--compare-publish 5m runs a third dcpid (slices on) with the old 5-minute publish interval.

  sudo python3 bench/slices.py --duration 1200                  # 20 minutes + warm-up
  sudo python3 bench/slices.py --duration 3600 --bin-dir target/release --perf /usr/bin/perf

Needs root, cc, python3 and the binaries (dcpid, dcpictl in --bin-dir; the example is built by
cargo). Writes bench/results/slices-<timestamp>.json and .md and prints the table.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
from collector import add_spool_parent, spool_dir  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
PY_LOOP = "s=0\nfor i in range(300000):\n    s += i * i\nprint(s)\n"


class Dcpid(bench.Dcpid):
    def __init__(self, bins, workdir, rate, max_secs, extra):
        super().__init__(bins, workdir, rate, max_secs)
        self.extra = extra

    def cmd(self):
        return super().cmd() + self.extra


def busy_mix(workdir):
    srcs = [os.path.join(BENCH, "workloads", f) for f in ("churn.c", "cpu.c", "mem.c", "mix.c")]
    out = os.path.join(workdir, "cc-out")
    os.makedirs(out, exist_ok=True)
    cc = ("while :; do for f in " + " ".join(srcs) + "; do cc -O2 -c \"$f\" -o "
          + out + "/x.o 2>/dev/null; done; done")
    py = os.path.join(workdir, "loop.py")
    with open(py, "w") as f:
        f.write(PY_LOOP)
    loops = [cc, f"while :; do python3 {py} >/dev/null; done", "while :; do /bin/true; done"]
    return [subprocess.Popen(["bash", "-c", c], start_new_session=True) for c in loops]


def stop_mix(procs):
    for p in procs:
        try:
            os.killpg(p.pid, 9)
        except OSError:
            pass
        p.wait()


# Written once per build-id (symbol tables, FORMAT.md §10) or per kernel (the kallsyms
# snapshot), whatever the day: counted apart from the per-day growth and writes. On this
# machine other builds make new binaries all the time, which made binaries/ most of the
# database's growth (BENCHMARKS.md "Time-slice segments").
ONE_TIME = ("binaries", "kallsyms")


def one_time(db):
    """(apparent, allocated) bytes of the one-time files under db."""
    app = alloc = 0
    for d in ONE_TIME:
        a, b, _ = bench.tree_bytes(os.path.join(db, d)) if os.path.isdir(os.path.join(db, d)) \
            else (0, 0, 0)
        app += a
        alloc += b
    return app, alloc


def db_bytes(db):
    """The database's bytes without the one-time files (ONE_TIME)."""
    return bench.tree_bytes(db)[0] - one_time(db)[0] if os.path.exists(db) else 0


SLICE_FILE = re.compile(r"^slices(\.[0-9]+|\.hours)?\.log$")


def slices_logs(db):
    """Every slice file: segments slices.<hour>.log, slices.hours.log, an older slices.log
    (FORMAT.md §14.5)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(db) for f in fs if SLICE_FILE.match(f)]


def slices_bytes(db):
    return sum(os.path.getsize(p) for p in slices_logs(db))


def try_flush(d):
    """Flush d; on a flush that does not complete (a busy disk: `dcpictl flush` gives up after
    20 s, the samples stay in the spool) say so and go on: a lost hour-long run costs more than
    one snapshot taken before the publication caught up. Returns whether it completed."""
    for _ in range(3):
        try:
            d.flush()
            return True
        except bench.ProfilerError as e:
            bench.log(f"slices: flush of {d.dir} incomplete, retrying: {e}")
    return False


def snap(on, off, perf=None, cmp=None, flush_off=True, ext=None, ext_tot=None):
    ok = True
    if ext_tot:
        # The off-CPU pair's totals daemon (slices off) stands for its epoch totals, so it is
        # flushed for the same reason as the slices-off one (below). Its slices-on twin `ext`
        # is not: a flush ends the current slice early, and a minute stored as two records
        # overstates the slice files (the tenth session's 11.0 MB upper bound).
        ok = try_flush(ext_tot) and ok
    if flush_off:
        # The slices-off daemon's database stands for the epoch totals of a day-long epoch.
        # Unflushed, its size follows the publish schedule (nothing at all until the first
        # publication at `publish_interval`, 15 min, then steps at each republish), and a rate
        # taken over a window that contains a step counts the step as growth. Flushed before
        # each snapshot it holds every sample so far, so its growth is the totals' own.
        ok = try_flush(off) and ok
    return {"flushed": ok, "t": time.monotonic(), "on_db": db_bytes(on.db),
            "off_db": db_bytes(off.db),
            "on_slices": slices_bytes(on.db),
            "on_one_time": one_time(on.db)[0], "on_one_time_alloc": one_time(on.db)[1],
            "off_one_time_alloc": one_time(off.db)[1],
            "cmp_one_time_alloc": one_time(cmp.db)[1] if cmp else 0,
            "on_written": bench.proc_io(on.proc.pid).get("write_bytes", 0),
            "off_written": bench.proc_io(off.proc.pid).get("write_bytes", 0),
            "cmp_written": bench.proc_io(cmp.proc.pid).get("write_bytes", 0) if cmp else 0,
            "perf_data": os.path.getsize(perf.data) if perf and os.path.exists(perf.data) else 0,
            "ext_db": db_bytes(ext.db) if ext else 0,
            "ext_slices": slices_bytes(ext.db) if ext else 0,
            "ext_written": bench.proc_io(ext.proc.pid).get("write_bytes", 0) if ext else 0,
            "ext_one_time_alloc": one_time(ext.db)[1] if ext else 0,
            "ext_tot_db": db_bytes(ext_tot.db) if ext_tot else 0}


def slice_files_day(db, args):
    """The slice files of db read back (`slices_stat`), and a day of them projected: 360
    minute records of the window's mean size and 18 hour records, each the window's minutes
    rolled up into one and scaled linearly to 60 minutes. Returns (stats, minute records,
    mean minute bytes, window rolled up bytes, hour record bytes, day bytes)."""
    stats = []
    for p in slices_logs(db):
        r = subprocess.run(["cargo", "run", "-q"] + (["--release"] if args.release_stat else [])
                           + ["-p", "dcpi-profile-format", "--example", "slices_stat", "--", p],
                           capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            raise bench.ProfilerError(f"slices_stat {p}: {r.stderr.strip()}")
        stats.append(json.loads(r.stdout))
    # Bytes per minute weighted by the records' lengths: a `dcpictl flush` ends the current
    # slice early, so a daemon flushed before each snapshot (the off-CPU one) writes two
    # shorter records a minute, each with most of the minute's keys (an upper bound for it).
    recs = [r for s in stats for r in s["records"] if r["len"] > 0]
    minutes = sum(r["len"] for r in recs) / 60.0
    mean_min = sum(r["bytes"] for r in recs) / minutes if recs else 0
    window_min = max(1.0, minutes)
    rollup_bytes = sum(s["rollup_bytes"] for s in stats)
    hour_bytes = rollup_bytes * 60.0 / window_min
    return stats, recs, mean_min, rollup_bytes, hour_bytes, 360 * mean_min + 18 * hour_bytes


def slice_cpu(log_path):
    """(records, total CPU ns) from the last 'time slices appended' debug line."""
    last = None
    with open(log_path, errors="replace") as f:
        for line in f:
            if "time slices appended" in line:
                last = line
    if not last:
        return None
    rec = re.search(r"total_records=(\d+)", last)
    cpu = re.search(r"total_cpu_ns=(\d+)", last)
    return {"records": int(rec.group(1)), "cpu_ns": int(cpu.group(1))} if rec and cpu else None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1200, help="measured window, seconds")
    ap.add_argument("--warmup", type=float, default=60, help="seconds before the window")
    ap.add_argument("--rate", type=int, default=1000, help="samples per second per CPU")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--perf", default=None,
                    help="perf binary: also run `perf record -a` beside the daemons (Writes)")
    ap.add_argument("--compare-publish", default=None, metavar="DUR",
                    help="also run a third dcpid, slices on, with --publish-interval DUR (e.g. "
                         "5m, the old default), and compare its bytes written")
    add_spool_parent(ap, "tmpfs pages are not disk writes and write_bytes does not count them")
    ap.add_argument("--dcpid-arg", action="append", default=[], metavar="ARG",
                    help="one more dcpid argument for every daemon (repeat it), e.g. "
                         "--dcpid-arg=--publish-max-delay --dcpid-arg=4m")
    ap.add_argument("--offcpu-daemon", action="store_true",
                    help="also run two dcpid with `--off-cpu true` (issue 40's bytes with "
                         "off-CPU on): one with the defaults, not flushed, for its slice files "
                         "and its writes; one with `--slice-interval 0`, flushed before each "
                         "snapshot, for its epoch totals (projected as the slices-off daemon's)")
    ap.add_argument("--no-flush-off", dest="flush_off", action="store_false",
                    help="do not flush the slices-off daemon before each snapshot (its totals "
                         "then grow in publish steps; the projection used to be taken so)")
    ap.add_argument("--release-stat", action="store_true",
                    help="build the slices_stat example in release (default: debug; it only reads)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/slices.py: must run as root (system-wide profiling)", file=sys.stderr)
        return 2
    bins = {n: os.path.join(args.bin_dir, n) for n in ("dcpid", "dcpictl")}
    if args.perf:
        bins["perf"] = args.perf
    for b in bins.values():
        if not os.path.exists(b):
            print(f"bench/slices.py: {b} missing", file=sys.stderr)
            return 2
    work = args.work or tempfile.mkdtemp(prefix="dcpi-slices-", dir="/var/tmp")
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    life = args.warmup + args.duration + 600
    on = Dcpid(bins, os.path.join(work, "on"), args.rate, life,
               ["--log-level", "info,dcpid::store::slices=debug"] + args.dcpid_arg)
    off = Dcpid(bins, os.path.join(work, "off"), args.rate, life,
                ["--slice-interval", "0"] + args.dcpid_arg)
    cmp = None
    if args.compare_publish:
        cmp = Dcpid(bins, os.path.join(work, "cmp"), args.rate, life,
                    ["--publish-interval", args.compare_publish])
    ext = ext_tot = None
    if args.offcpu_daemon:
        ext = Dcpid(bins, os.path.join(work, "offcpu"), args.rate, life,
                    ["--off-cpu", "true"] + args.dcpid_arg)
        ext_tot = Dcpid(bins, os.path.join(work, "offcpu-totals"), args.rate, life,
                        ["--off-cpu", "true", "--slice-interval", "0"] + args.dcpid_arg)
    spools = []
    for d in (on, off) + ((cmp,) if cmp else ()) + ((ext, ext_tot) if ext else ()):
        os.makedirs(d.dir, exist_ok=True)
        d.spool_dir = spool_dir(args, "dcpi-slices-spool-")
        spools.append(d.spool_dir)
        # The log beside the spool, on the tmpfs: under systemd dcpid logs to the journal, not
        # to a file of its own, and the slices-on daemon's debug line per slice (read for its
        # CPU per slice) re-dirtied a page of the log file every minute, ~250 KB/h of
        # write_bytes that were the benchmark's, not the database's. Copied to the work
        # directory at the end.
        d.log_path = os.path.join(d.spool_dir, "dcpid.log")
    on.start()
    off.start()
    if cmp:
        cmp.start()
    if ext:
        ext.start()
        ext_tot.start()
    perf = bench.Perf(bins, os.path.join(work, "perf"), args.rate, life) if args.perf else None
    if perf:
        perf.start()
    mix = busy_mix(os.path.join(work, "mix"))
    series = []
    try:
        bench.log(f"slices: warm-up {args.warmup:.0f} s, window {args.duration:.0f} s")
        time.sleep(args.warmup)
        a = snap(on, off, perf, cmp, args.flush_off, ext, ext_tot)
        series.append(a)
        end = a["t"] + args.duration
        while time.monotonic() < end:
            time.sleep(min(60, max(0.0, end - time.monotonic())))
            series.append(snap(on, off, perf, cmp, args.flush_off, ext, ext_tot))
        b = series[-1]
        for d in (on, off) + ((cmp,) if cmp else ()) + ((ext, ext_tot) if ext else ()):
            if d.proc.poll() is not None:
                raise bench.ProfilerError(f"dcpid exited with {d.proc.returncode} in the window")
    finally:
        stop_mix(mix)
    on.stop()
    off.stop()
    if cmp:
        cmp.stop()
    ext_status = ext.status() if ext else None
    if ext:
        ext.stop()
        ext_tot.stop()
    if perf:
        perf.stop()
    cpu = slice_cpu(on.log_path)
    for d in (on, off) + ((cmp,) if cmp else ()) + ((ext, ext_tot) if ext else ()):
        if os.path.exists(d.log_path):
            shutil.copy(d.log_path, os.path.join(d.dir, "dcpid.log"))
    stats, recs, mean_min, rollup_bytes, hour_bytes, slices_day = slice_files_day(on.db, args)
    secs = b["t"] - a["t"]
    ncpu = os.cpu_count()
    half = series[len(series) // 2]
    off_rate = (b["off_db"] - half["off_db"]) / max(1.0, b["t"] - half["t"])
    totals_day = b["off_db"] + off_rate * (86400 - (b["t"] - series[0]["t"]) - args.warmup)
    # The last quarter's rate too: distinct pairs saturate, so the later the rate, the closer
    # to a day's (reported beside the second half's, which the projection uses).
    quarter = series[(3 * len(series)) // 4]
    off_rate_q4 = (b["off_db"] - quarter["off_db"]) / max(1.0, b["t"] - quarter["t"])
    res = {
        "commit": rev, "args": vars(args), "cpus": ncpu, "window_s": secs,
        "loadavg_end": os.getloadavg(),
        "on_db_growth": b["on_db"] - a["on_db"], "off_db_growth": b["off_db"] - a["off_db"],
        "slices_log_growth": b["on_slices"] - a["on_slices"],
        "minute_records": len(recs), "mean_minute_record_bytes": mean_min,
        "mean_minute_record_pairs": sum(r["pairs"] for r in recs) / len(recs) if recs else 0,
        "mean_minute_record_samples": sum(r["samples"] for r in recs) / len(recs) if recs else 0,
        "window_rolled_up_bytes": rollup_bytes, "hour_record_bytes_projected": hour_bytes,
        "slices_log_day_projected": slices_day,
        "totals_rate_second_half_Bps": off_rate, "totals_rate_last_quarter_Bps": off_rate_q4,
        "off_flushed_before_snapshots": args.flush_off, "totals_day_projected": totals_day,
        "per_core_day_slices_on": (slices_day + totals_day) / ncpu,
        "per_core_day_slices_off": totals_day / ncpu,
        "slice_cpu": cpu,
        # write_bytes minus the pages of the one-time files created in the window (a file
        # written once dirties its allocated blocks once).
        "on_one_time_written": b["on_one_time_alloc"] - a["on_one_time_alloc"],
        "on_one_time_growth": b["on_one_time"] - a["on_one_time"],
        "on_one_time_end": b["on_one_time"],
        "on_written_raw": b["on_written"] - a["on_written"],
        "on_written": (b["on_written"] - a["on_written"])
        - (b["on_one_time_alloc"] - a["on_one_time_alloc"]),
        "off_written": (b["off_written"] - a["off_written"])
        - (b["off_one_time_alloc"] - a["off_one_time_alloc"]),
        "cmp_written": (b["cmp_written"] - a["cmp_written"])
        - (b["cmp_one_time_alloc"] - a["cmp_one_time_alloc"]) if cmp else None,
        "perf_data_growth": b["perf_data"] - a["perf_data"] if perf else None,
        "cpu_per_slice_ms": (cpu["cpu_ns"] / cpu["records"] / 1e6) if cpu and cpu["records"] else None,
        "series": series, "slices_stat": [{k: v for k, v in s.items() if k != "records"} for s in stats],
    }
    hour = 3600.0 / secs
    res["on_written_per_hour"] = res["on_written"] * hour
    res["off_written_per_hour"] = res["off_written"] * hour
    # After 6 h: the appends plus one hour record an hour (the roll-up appends it to
    # slices.hours.log and unlinks the hour's segment, FORMAT.md §14.5; nothing is rewritten).
    res["on_written_per_hour_after_6h"] = res["on_written_per_hour"] + hour_bytes
    if cmp:
        res["cmp_written_per_hour"] = res["cmp_written"] * hour
    if ext:
        # As the slices-on and slices-off pair's: the slice files from the unflushed daemon's
        # own minute and rolled-up records; the epoch totals (off-CPU event included) from
        # the flushed slices-off twin, grown linearly for a day at the second half's rate.
        ext_tot_rate = (b["ext_tot_db"] - half["ext_tot_db"]) / max(1.0, b["t"] - half["t"])
        ext_totals_day = b["ext_tot_db"] + ext_tot_rate * (
            86400 - (b["t"] - series[0]["t"]) - args.warmup)
        ext_rate = ext_tot_rate
        _, ext_recs, ext_min, _, ext_hour, ext_slices_day = slice_files_day(ext.db, args)
        res["offcpu_db_growth"] = b["ext_db"] - a["ext_db"]
        res["offcpu_slices_growth"] = b["ext_slices"] - a["ext_slices"]
        res["offcpu_mean_minute_record_bytes"] = ext_min
        res["offcpu_hour_record_bytes_projected"] = ext_hour
        res["offcpu_slice_files_day_projected"] = ext_slices_day
        res["offcpu_totals_rate_second_half_Bps"] = ext_rate
        res["offcpu_totals_day_projected"] = ext_totals_day
        res["offcpu_day_projected"] = ext_slices_day + ext_totals_day
        res["per_core_day_offcpu"] = res["offcpu_day_projected"] / ncpu
        res["offcpu_written"] = (b["ext_written"] - a["ext_written"]) \
            - (b["ext_one_time_alloc"] - a["ext_one_time_alloc"])
        res["offcpu_written_per_hour"] = res["offcpu_written"] * hour
        res["offcpu_status"] = ext_status
    if perf:
        res["perf_per_hour"] = res["perf_data_growth"] * hour
        res["writes_ratio_first_6h"] = res["perf_data_growth"] / max(1, res["on_written"])
        res["writes_ratio_after_6h"] = res["perf_per_hour"] / max(1, res["on_written_per_hour_after_6h"])
        if cmp:
            res["writes_ratio_cmp_first_6h"] = res["perf_data_growth"] / max(1, res["cmp_written"])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.join(BENCH, "results", f"slices-{stamp}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    mb = 1e6
    md = (f"# time slices storage, commit {rev}, {stamp}\n\n"
          f"`python3 bench/slices.py --duration {args.duration:g} --warmup {args.warmup:g} "
          f"--rate {args.rate}`, spools on {args.spool_parent}, load at the end "
          f"{os.getloadavg()[0]:.1f}, {ncpu} CPUs, window {secs:.0f} s\n\n"
          "| | slices on (1m, roll-up after 6h) | slices off |\n|---|---|---|\n"
          f"| database growth in the window | {res['on_db_growth'] / 1e3:.0f} KB "
          f"(slice files {res['slices_log_growth'] / 1e3:.0f} KB) | {res['off_db_growth'] / 1e3:.0f} KB |\n"
          f"| minute record | {mean_min / 1e3:.1f} KB mean over {len(recs)} "
          f"({res['mean_minute_record_pairs']:.0f} pairs, {res['mean_minute_record_samples']:.0f} samples) | |\n"
          f"| hour record (projected) | {hour_bytes / 1e3:.0f} KB | |\n"
          f"| slice files of a day (360 min + 18 h) | {slices_day / mb:.2f} MB | |\n"
          f"| epoch totals of a day (projected{', flushed each snapshot' if args.flush_off else ''}; "
          f"growth {off_rate:.0f} B/s over the second half, {off_rate_q4:.0f} B/s over the last "
          f"quarter) | {totals_day / mb:.2f} MB | {totals_day / mb:.2f} MB |\n"
          f"| one-time files (binaries/ symbol tables, kallsyms snapshot), apart | "
          f"{res['on_one_time_end'] / 1e3:.0f} KB at the end, {res['on_one_time_growth'] / 1e3:.0f} KB "
          f"({res['on_one_time_written'] / 1e3:.0f} KB of blocks) in the window | |\n"
          f"| **per core-day** | **{res['per_core_day_slices_on'] / mb:.2f} MB** | "
          f"{res['per_core_day_slices_off'] / mb:.2f} MB |\n"
          f"| bytes written per hour (write_bytes less the one-time files' blocks; spools on "
          f"{args.spool_parent}) | {res['on_written_per_hour'] / mb:.2f} MB "
          f"(raw {res['on_written_raw'] * hour / mb:.2f} MB); "
          f"after 6 h with the hourly roll-up {res['on_written_per_hour_after_6h'] / mb:.2f} MB | "
          f"{res['off_written_per_hour'] / mb:.2f} MB |\n"
          + (f"| bytes written per hour, slices on, `--publish-interval {args.compare_publish}` "
             f"| {res['cmp_written_per_hour'] / mb:.2f} MB | |\n" if cmp else "")
          + (f"| perf.data growth per hour, side by side | {res['perf_per_hour'] / mb:.1f} MB: "
             f"{res['writes_ratio_first_6h']:.0f}x the slices-on dcpid's writes "
             f"({res['writes_ratio_after_6h']:.0f}x after 6 h)"
             + (f"; {res['writes_ratio_cmp_first_6h']:.0f}x the `--publish-interval "
                f"{args.compare_publish}` one's" if cmp else "") + " | |\n" if perf else "")
          + (f"| with `--off-cpu true` (two more dcpid: slices on, not flushed; slices off, "
             f"flushed each snapshot, for the totals): database "
             f"growth {res['offcpu_db_growth'] / 1e3:.0f} KB (slice files "
             f"{res['offcpu_slices_growth'] / 1e3:.0f} KB); minute record "
             f"{res['offcpu_mean_minute_record_bytes'] / 1e3:.1f} KB, hour record "
             f"{res['offcpu_hour_record_bytes_projected'] / 1e3:.0f} KB: slice files of a day "
             f"{res['offcpu_slice_files_day_projected'] / mb:.2f} MB; the rest "
             f"{res['offcpu_totals_rate_second_half_Bps']:.0f} B/s over the second half, a day "
             f"{res['offcpu_totals_day_projected'] / mb:.2f} MB | "
             f"**{res['per_core_day_offcpu'] / mb:.2f} MB per core-day**; writes "
             f"{res['offcpu_written_per_hour'] / mb:.2f} MB/h | |\n" if ext else "")
          + f"| daemon CPU per slice | {res['cpu_per_slice_ms'] if res['cpu_per_slice_ms'] is not None else float('nan'):.2f} ms | |\n")
    with open(out + ".md", "w") as f:
        f.write(md)
    print(md)
    for sp in spools:
        shutil.rmtree(sp, ignore_errors=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
