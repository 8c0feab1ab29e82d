#!/usr/bin/env python3
"""Disk write volume of dcpid against `perf record -a`, side by side, on a busy mix.

Busy mix: one loop compiling C files with `cc -O2` (cc1, as, collect2/ld: process churn) and one
loop running a short Python program, one per CPU. dcpid and `perf record -a -e cpu-clock -c N`
sample at the same rate (1 kHz per CPU by default) at the same time. After a warm-up (start-up,
first publications), over the measured window:

  dcpid   bytes written: /proc/PID/io write_bytes (every file it writes: spool, profiles,
          summaries, kallsyms snapshots; the kernel counts each newly dirtied page as 4 KiB),
          and per file kind from `dcpictl status` (store.bytes_written, syscall bytes);
          growth of the database and of the spool directory
  perf    growth of perf.data (and its write_bytes)

once per flush interval given (default: the daemon's default, then 1 s, 5 s, 30 s).

  sudo python3 bench/disk.py --duration 90                       # about 8 minutes
  sudo python3 bench/disk.py --duration 3600 --intervals default # the one-hour run

Needs root, perf, cc, python3, and release binaries (cargo build --release -p dcpi-daemon -p
dcpi-client). Writes bench/results/disk-<timestamp>.json and .md and prints the table.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (Dcpid, Perf, proc_io, tree_bytes)

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)

PY_LOOP = "s=0\nfor i in range(300000):\n    s += i * i\nprint(s)\n"


class DcpidFlush(bench.Dcpid):
    def __init__(self, bins, workdir, rate, max_secs, flush, spool_on, publish, extra=()):
        super().__init__(bins, workdir, rate, max_secs)
        self.extra = list(extra)
        self.flush_arg = flush
        self.publish_arg = publish
        os.makedirs(workdir, exist_ok=True)
        self.tmpfs_spool = spool_on == "tmpfs"
        if self.tmpfs_spool:
            # What the unit does (/run is a tmpfs under systemd); /run is not one on every machine
            # this runs on, /dev/shm is.
            self.spool_dir = tempfile.mkdtemp(prefix="dcpi-disk-spool-", dir="/dev/shm")

    def cmd(self):
        c = super().cmd()
        if self.flush_arg != "default":
            c += ["--flush-interval", self.flush_arg]
        if self.publish_arg != "default":
            c += ["--publish-interval", self.publish_arg]
        return c + self.extra


class PerfCallchains(bench.Perf):
    """perf record -a -g: frame-pointer call chains, as `dcpid --callchains fp`."""

    def cmd(self):
        c = super().cmd()
        return c[:2] + ["-g"] + c[2:]


def busy_mix(workdir):
    """Start the two loops; returns their Popen objects."""
    srcs = [os.path.join(BENCH, "workloads", f) for f in ("churn.c", "cpu.c", "mem.c", "mix.c")]
    out = os.path.join(workdir, "cc-out")
    os.makedirs(out, exist_ok=True)
    cc = ("while :; do for f in " + " ".join(srcs) + "; do cc -O2 -c \"$f\" -o "
          + out + "/x.o 2>/dev/null; done; done")
    py = os.path.join(workdir, "loop.py")
    with open(py, "w") as f:
        f.write(PY_LOOP)
    pyloop = f"while :; do python3 {py} >/dev/null; done"
    return [subprocess.Popen(["bash", "-c", cc], start_new_session=True),
            subprocess.Popen(["bash", "-c", pyloop], start_new_session=True)]


def stop_mix(procs):
    for p in procs:
        try:
            os.killpg(p.pid, 9)
        except OSError:
            pass
        p.wait()


def snap(d, p):
    st = d.status()
    return {"t": time.monotonic(), "dcpid_io": d.io(), "perf_io": p.io(),
            "dcpid_disk": d.disk(), "perf_disk": p.disk(),
            "bytes_written": (st.get("store") or {}).get("bytes_written", {}),
            "samples": (st.get("aggregator") or st.get("sampler") or {}),
            "status": st}


def pair_result(a, b, after, secs):
    """The figures of one (dcpid, perf) pair between snapshots a and b; `after` is the pair's
    disk use once both have stopped (dcpid's final publish done)."""
    dw = b["dcpid_io"].get("write_bytes", 0) - a["dcpid_io"].get("write_bytes", 0)
    dwc = b["dcpid_io"].get("wchar", 0) - a["dcpid_io"].get("wchar", 0)
    pgrow = b["perf_disk"]["total_bytes"] - a["perf_disk"]["total_bytes"]
    pw = b["perf_io"].get("write_bytes", 0) - a["perf_io"].get("write_bytes", 0)
    kinds = {k: b["bytes_written"].get(k, 0) - a["bytes_written"].get(k, 0)
             for k in ("spool", "profiles", "summaries", "kallsyms")}
    d_status = b["status"]
    db_growth = b["dcpid_disk"]["db_bytes"] - a["dcpid_disk"]["db_bytes"]
    return {
        "secs": secs,
        "dcpid_write_bytes": dw, "dcpid_wchar": dwc,
        "dcpid_bytes_by_kind": kinds,
        "db_growth": db_growth,
        "spool_growth": b["dcpid_disk"]["spool_bytes"] - a["dcpid_disk"]["spool_bytes"],
        "spool_bytes_end": b["dcpid_disk"]["spool_bytes"],
        "db_bytes_end": b["dcpid_disk"]["db_bytes"],
        "perf_data_end": b["perf_disk"]["total_bytes"],
        "ratio_perf_data_to_db_at_end":
            b["perf_disk"]["total_bytes"] / b["dcpid_disk"]["db_bytes"]
            if b["dcpid_disk"]["db_bytes"] else None,
        # After the stop: the database holds everything sampled (the spool is published).
        "db_bytes_after_stop": after["db_bytes"],
        "db_files_after_stop": after["db_files"],
        "stack_file_bytes_after_stop": after["stack_bytes"],
        "perf_data_after_stop": after["perf_bytes"],
        "ratio_perf_data_to_db_after_stop":
            after["perf_bytes"] / after["db_bytes"] if after["db_bytes"] else None,
        "perf_data_growth": pgrow, "perf_write_bytes": pw,
        "ratio_perf_growth_to_dcpid_write_bytes": pgrow / dw if dw else None,
        "ratio_perf_growth_to_dcpid_db_growth": pgrow / db_growth if db_growth > 0 else None,
        "dcpid_samples_end": d_status.get("samples"),
        "dcpid_status_end": {k: d_status.get("store", {}).get(k) for k in
                             ("spool_rows", "spool_bytes", "spool_quarantined", "dirty_profiles",
                              "published_files")},
    }


def disk_after(d, p):
    files, stack = 0, 0
    for dirpath, _, fs in os.walk(d.db):
        for name in fs:
            files += 1
            if name.endswith(".stk"):
                try:
                    stack += os.path.getsize(os.path.join(dirpath, name))
                except OSError:
                    pass
    return {"db_bytes": d.disk()["db_bytes"], "db_files": files, "stack_bytes": stack,
            "perf_bytes": p.disk()["total_bytes"]}


def one(bins, work, rate, flush, warmup, duration, spool_on="disk", publish="default",
        stacks=False):
    tag = f"{flush}-{spool_on}-{publish}".replace(".", "_")
    life = warmup + duration + 600
    pairs = [(DcpidFlush(bins, os.path.join(work, f"dcpid-{tag}"), rate, life, flush, spool_on,
                         publish),
              bench.Perf(bins, os.path.join(work, f"perf-{tag}"), rate, life))]
    if stacks:
        # The call-stack pair samples the same mix in the same window (issue #19's hour).
        pairs.append((DcpidFlush(bins, os.path.join(work, f"dcpid-fp-{tag}"), rate, life, flush,
                                 spool_on, publish, ["--callchains", "fp"]),
                      PerfCallchains(bins, os.path.join(work, f"perf-g-{tag}"), rate, life)))
    for d, p in pairs:
        d.start()
        p.start()
    mix = busy_mix(os.path.join(work, f"mix-{tag}"))
    try:
        time.sleep(warmup)
        a = [snap(d, p) for d, p in pairs]
        time.sleep(duration)
        b = [snap(d, p) for d, p in pairs]
        # A collector that died during the window (perf record exits when the disk fills)
        # would make the other look arbitrarily good: refuse the run instead.
        for d, p in pairs:
            for who, proc in (("perf record", p.proc), ("dcpid", d.proc)):
                if proc.poll() is not None:
                    raise bench.ProfilerError(f"{who} exited with {proc.returncode} during the window")
    finally:
        stop_mix(mix)
    after = []
    for d, p in pairs:
        p.stop()
        d.stop()
        after.append(disk_after(d, p))
        if d.tmpfs_spool:
            shutil.rmtree(d.spool_dir, ignore_errors=True)
    secs = b[0]["t"] - a[0]["t"]
    res = {"flush_interval": flush, "spool_on": spool_on, "publish_interval": publish,
           "rate_hz": rate, "perf_samples": pairs[0][1].samples,
           "loadavg_end": os.getloadavg()}
    res.update(pair_result(a[0], b[0], after[0], secs))
    if stacks:
        res["stacks"] = pair_result(a[1], b[1], after[1], secs)
        res["stacks"]["perf_samples"] = pairs[1][1].samples
    return res


def fmt_b(n):
    return f"{n / 1024:.1f} KiB" if n is not None else "-"


def table(results):
    L = ["| flush | spool on | publish | window | perf.data growth | dcpid write_bytes | ratio | dcpid wchar | spool | profiles | summaries | kallsyms | db growth | perf / db growth |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        k = r["dcpid_bytes_by_kind"]
        ratio = r["ratio_perf_growth_to_dcpid_write_bytes"]
        dbr = r["ratio_perf_growth_to_dcpid_db_growth"]
        cfg = f"| {r['flush_interval']} | {r.get('spool_on', 'disk')} | {r.get('publish_interval', 'default')} "
        L.append(cfg + f"| {r['secs']:.0f} s | {fmt_b(r['perf_data_growth'])} | "
                 f"{fmt_b(r['dcpid_write_bytes'])} | **{ratio:.0f}x** | {fmt_b(r['dcpid_wchar'])} | "
                 f"{fmt_b(k['spool'])} | {fmt_b(k['profiles'])} | {fmt_b(k['summaries'])} | "
                 f"{fmt_b(k['kallsyms'])} | {fmt_b(r['db_growth'])} | "
                 f"{(f'{dbr:.0f}x' if dbr else '-')} |" if ratio else
                 cfg + f"| {r['secs']:.0f} s | {fmt_b(r['perf_data_growth'])} | 0 | - | | | | | | | |")
    return "\n".join(L)


def end_table(results):
    """Sizes once both collectors stopped, and the call-stack pair when it ran."""
    L = ["| flush | pair | perf.data | dcpid db (files) | perf.data / db | perf.data growth / dcpid write_bytes | stack file |",
         "|---|---|---|---|---|---|---|"]
    for r in results:
        for name, x in (("dcpid / perf record -a", r), ("dcpid --callchains fp / perf record -a -g", r.get("stacks"))):
            if not x:
                continue
            ratio = x["ratio_perf_data_to_db_after_stop"]
            wr = x["ratio_perf_growth_to_dcpid_write_bytes"]
            L.append(f"| {r['flush_interval']} | {name} | {fmt_b(x['perf_data_after_stop'])} | "
                     f"{fmt_b(x['db_bytes_after_stop'])} ({x['db_files_after_stop']}) | "
                     f"**{ratio:.0f}x** | {f'{wr:.0f}x' if wr else '-'} | "
                     f"{fmt_b(x['stack_file_bytes_after_stop'])} |" if ratio else
                     f"| {r['flush_interval']} | {name} | - | - | - | - | - |")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=90, help="measured window, seconds")
    ap.add_argument("--warmup", type=float, default=20, help="seconds before the window")
    ap.add_argument("--rate", type=int, default=1000, help="samples per second per CPU")
    ap.add_argument("--intervals", default="default,1s,5s,30s",
                    help="comma-separated flush intervals (`default` = the daemon's default)")
    ap.add_argument("--spool-on", default="disk",
                    help="comma-separated: `disk` (the work directory) and/or `tmpfs` (/dev/shm, as "
                         "the unit's /run/dcpid/spool under systemd)")
    ap.add_argument("--publish-intervals", default="default",
                    help="comma-separated publish intervals (`default` = the daemon's default)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--stacks", action="store_true",
                    help="also run `dcpid --callchains fp` against `perf record -a -g`, same window")
    ap.add_argument("--work", default=None, help="work directory (default: a temporary one on /var/tmp)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/disk.py: must run as root (system-wide profiling)", file=sys.stderr)
        return 2
    bins = {n: os.path.join(args.bin_dir, n) for n in ("dcpid", "dcpictl", "dcpiprof")}
    bins["perf"] = shutil.which("perf") or "perf"
    for n, b in bins.items():
        if n != "perf" and not os.path.exists(b):
            print(f"bench/disk.py: {b} missing (cargo build --release -p dcpi-daemon -p dcpi-client)",
                  file=sys.stderr)
            return 2
    # On a real disk: tmpfs pages are never counted in write_bytes.
    work = args.work or tempfile.mkdtemp(prefix="dcpi-disk-", dir="/var/tmp")
    # The commit measured is the one at the start (the tree may move during an hour's run).
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    results = []
    configs = [(f.strip(), s.strip(), p.strip()) for f in args.intervals.split(",")
               for s in args.spool_on.split(",") for p in args.publish_intervals.split(",")]
    for flush, spool_on, publish in configs:
        bench.log(f"disk: flush interval {flush}, spool on {spool_on}, publish {publish}: "
                  f"warm-up {args.warmup:.0f} s, window {args.duration:.0f} s")
        r = one(bins, work, args.rate, flush, args.warmup, args.duration, spool_on, publish,
                args.stacks)
        bench.log(f"disk: perf.data +{r['perf_data_growth']} B, dcpid write_bytes +{r['dcpid_write_bytes']} B")
        results.append(r)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.join(BENCH, "results", f"disk-{stamp}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    doc = {"commit": rev, "args": vars(args), "results": results}
    with open(out + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    md = (f"# disk write volume, commit {rev}, {stamp}\n\n"
          f"`python3 bench/disk.py --duration {args.duration:g} --warmup {args.warmup:g} "
          f"--rate {args.rate} --intervals {args.intervals} --spool-on {args.spool_on} "
          f"--publish-intervals {args.publish_intervals}{' --stacks' if args.stacks else ''}`\n\n"
          + table(results) + "\n\nAfter both collectors stopped (dcpid's last publish done):\n\n"
          + end_table(results) + "\n")
    with open(out + ".md", "w") as f:
        f.write(md)
    print(md)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
