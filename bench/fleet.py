#!/usr/bin/env python3
"""Fleet-scale benchmarks: dcpiprof reports and dcpiexport over generated fleet databases.

Measures, on databases written by bench/fleetgen through the profile-format crate:

  reports  100 hosts x 24 epochs x 200 images (480,000 profiles): the per-image report read
           from the summary index, and from the profiles (the same database with the index
           removed from every summary.json, profiles hard-linked), and the per-symbol report of
           one image; each with a cold page cache (sync; echo 3 > /proc/sys/vm/drop_caches,
           needs root) and warm (median of --reps runs). Checks both per-image reports are
           byte-identical.
  curve    the per-image report (index path) over growing fleets up to 1,000 hosts x 30 epochs:
           summaries only (fleetgen --profiles 0: the report opens no profile), cold and warm,
           with the bytes it reads, to show that time follows what is read.
  export   dcpiexport --format parquet over the 100 x 24 fleet: rows/s, bytes/row, and the
           incremental second run.

Usage: python3 bench/fleet.py [--quick] [--curve 100x24,250x24,500x30,1000x30] [--skip-export]
Writes bench/results/fleet-<timestamp>.json and .md. Only the standard library is used.
"""

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import bench  # noqa: E402  (helpers: run, log, med, tree_bytes, tree_rev, write_image_list)

ROOT = bench.ROOT
log, run, med = bench.log, bench.run, bench.med


def drop_caches():
    subprocess.run(["sync"], check=False)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


COLD_REPS = 3
LAST_COLD_READ = {}


def timed(cmd, cold, reps):
    """(cold median seconds or None, warm median seconds, stdout, stderr of the last run, CPU
    seconds (user + sys) of the cold and the warm medians). Cold: COLD_REPS runs, each after
    dropping the page cache; the median bytes they read from the disk (getrusage inblock, 512
    bytes each) is left in LAST_COLD_READ."""
    def once():
        t = time.monotonic()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = run(cmd, timeout=3600)
        dt = time.monotonic() - t
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-800:]}")
        return dt, cpu, (r1.ru_inblock - r0.ru_inblock) * 512, r
    c = c_cpu = None
    LAST_COLD_READ.clear()
    if cold:
        cs = []
        for _ in range(COLD_REPS):
            drop_caches()
            dt, cpu, inb, _ = once()
            cs.append((dt, cpu, inb))
        c, c_cpu = med([x[0] for x in cs]), med([x[1] for x in cs])
        LAST_COLD_READ["disk_bytes"] = med([x[2] for x in cs])
        LAST_COLD_READ["cold_runs_s"] = [x[0] for x in cs]
    ws, wcpu = [], []
    r = None
    for _ in range(reps):
        dt, cpu, _, r = once()
        ws.append(dt)
        wcpu.append(cpu)
    return c, med(ws), r.stdout, r.stderr, (c_cpu, med(wcpu))


def stat_line(err):
    for line in err.splitlines():
        if "stats:" in line:
            return dict(kv.split("=", 1) for kv in line.split("stats:", 1)[1].split())
    return {}


def summary_bytes(db, name="summary.json"):
    total = n = 0
    for d, _, fs in os.walk(db):
        if name in fs:
            total += os.path.getsize(os.path.join(d, name))
            n += 1
    return total, n


class Fleet:
    def __init__(self, a):
        self.a = a
        self.cache = "/var/tmp/dcpi-bench"
        os.makedirs(self.cache, exist_ok=True)
        self.res = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    "loadavg_at_start": os.getloadavg(),
                    "cpus": os.cpu_count(), "uname": os.uname().release,
                    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                             capture_output=True, text=True).stdout.strip(),
                    "command": " ".join(sys.argv)}
        self.prof = os.path.join(ROOT, "target", "release", "dcpiprof")
        self.exporter = os.path.join(ROOT, "target", "release", "dcpiexport")
        self.fleetgen = os.path.join(BENCH, "fleetgen", "target", "release", "dcpi-fleetgen")
        self.old_prof = a.old_prof if a.old_prof and os.path.exists(a.old_prof) else None

    def build(self):
        log("building release binaries (no-op when up to date)")
        for cmd in (["cargo", "build", "--release", "-p", "dcpi-client", "--bin", "dcpiprof"],
                    ["cargo", "build", "--release", "-p", "dcpi-export"],
                    ["cargo", "build", "--release", "--manifest-path",
                     os.path.join(BENCH, "fleetgen", "Cargo.toml")]):
            r = run(cmd, cwd=ROOT)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-2000:]}")

    def images(self):
        p = os.path.join(self.cache, "images.tsv")
        if not os.path.exists(p):
            bench.write_image_list(p, 200)
        return p

    def gen(self, name, hosts, epochs, images, max_offsets, profiles=True, json_index=True):
        stamp = (f"{name}-{hosts}x{epochs}x{images}-{max_offsets}-{int(profiles)}"
                 f"{int(json_index)}-"
                 f"{bench.tree_rev('profile-format')}-{bench.tree_rev('bench/fleetgen')}")
        out = os.path.join(self.cache, stamp)
        info = out + ".json"
        if os.path.exists(info):
            with open(info) as f:
                return out, json.load(f)
        for old in os.listdir(self.cache):  # previous versions of this db: large, drop them
            if old.startswith(f"{name}-{hosts}x{epochs}x"):
                p = os.path.join(self.cache, old)
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
        log(f"generating {name}: {hosts} hosts x {epochs} epochs x {images} images")
        t = time.monotonic()
        r = run([self.fleetgen, "--out", out, "--images", self.images(), "--hosts", str(hosts),
                 "--epochs", str(epochs), "--images-per-host", str(images),
                 "--samples-per-host-epoch", str(7_200_000), "--max-offsets", str(max_offsets),
                 "--profiles", "1" if profiles else "0",
                 "--index", "1" if json_index else "0"], timeout=7200)
        if r.returncode != 0:
            raise RuntimeError(f"fleetgen: {r.stderr.strip()}")
        meta = json.loads(r.stdout)
        meta["gen_s"] = time.monotonic() - t
        meta["disk"] = dict(zip(("bytes", "alloc", "files"), bench.tree_bytes(out)))
        meta["summary_bytes"], meta["summaries"] = summary_bytes(out)
        meta["summary_idx_bytes"], meta["summary_idxs"] = summary_bytes(out, "summary.idx")
        with open(info, "w") as f:
            json.dump(meta, f)
        return out, meta

    def without_index(self, db):
        """The same database as written before any index: profiles hard-linked, every
        summary.json rewritten (new inode) without its `index`, no summary.idx."""
        out = db + "-noindex"
        if os.path.exists(out + ".done"):
            return out
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["cp", "-al", db, out], check=True)
        for d, _, fs in os.walk(out):
            if "summary.idx" in fs:
                os.unlink(os.path.join(d, "summary.idx"))
            if "summary.json" in fs:
                p = os.path.join(d, "summary.json")
                with open(p) as f:
                    s = json.load(f)
                s.pop("index", None)
                with open(p + ".new", "w") as f:
                    json.dump(s, f, indent=2)
                os.replace(p + ".new", p)
        open(out + ".done", "w").close()
        return out

    def reports(self):
        reps = self.a.reps
        h, e = (20, 6) if self.a.quick else (100, 24)
        db, meta = self.gen("fleet", h, e, 200, 4000)
        old = None if self.a.skip_profiles else self.without_index(db)
        with open(self.images()) as f:
            image = f.readline().rstrip("\n").split("\t")[3]
        base = ["--host", "all", "--epoch", "all", "--format", "json", "--verbose"]
        out = {"hosts": h, "epochs": e, "images_per_host": 200, "db": meta, "symbol_image": image}
        outs = {}
        # The same files read by this build (summary.idx) and by the build before it
        # (--old-prof: summary.json's JSON index), alternating so that both see the same load.
        runs = [("images_index", self.prof, db, []), ("images_old", self.old_prof, db, []),
                ("symbols", self.prof, db, ["--image", image]),
                ("symbols_old", self.old_prof, db, ["--image", image])]
        if not self.a.skip_profiles:
            runs.append(("images_profiles", self.prof, old, []))
        for k, prog, d, extra in runs:
            if not prog:
                continue
            log(f"reports: {k}")
            c, w, so, se, cpu = timed([prog, "--db", d] + base + extra, True,
                                      1 if k == "images_profiles" else reps)
            out[k] = {"cold_s": c, "warm_s": w, "cold_cpu_s": cpu[0], "warm_cpu_s": cpu[1],
                      "stats": stat_line(se), "stdout_bytes": len(so),
                      "cold_disk_bytes": LAST_COLD_READ.get("disk_bytes"),
                      "cold_runs_s": LAST_COLD_READ.get("cold_runs_s"),
                      "loadavg_after": os.getloadavg()}
            outs[k] = so
        def same(x, y):
            if x not in outs or y not in outs:
                return None
            a, b = json.loads(outs[x]), json.loads(outs[y])
            a.pop("database"), b.pop("database")
            return a == b
        out["identical"] = same("images_index", "images_profiles")
        out["identical_old"] = same("images_index", "images_old")
        out["identical_symbols_old"] = same("symbols", "symbols_old")
        self.res["reports"] = out

    def curve(self):
        pts = []
        for spec in self.a.curve.split(","):
            h, e = (int(x) for x in spec.split("x"))
            db, meta = self.gen("curve", h, e, 200, 8, profiles=False, json_index=False)
            log(f"curve: {h} x {e}")
            c, w, _, se, cpu = timed([self.prof, "--db", db, "--host", "all", "--epoch", "all",
                                      "--format", "json", "--verbose"], True, self.a.reps)
            st = stat_line(se)
            pts.append({"hosts": h, "epochs": e, "host_epochs": h * e,
                        "entries": h * e * 200, "summary_bytes": meta["summary_bytes"],
                        "summary_idx_bytes": meta["summary_idx_bytes"],
                        # Files the report opened: indexes, profiles (the counters), summaries
                        # of host-epochs without an index (none here).
                        "files_read": int(st.get("summary_indexes_used", 0))
                        + int(st.get("profiles_read", 0)),
                        "cold_disk_bytes": LAST_COLD_READ.get("disk_bytes"),
                        "cold_runs_s": LAST_COLD_READ.get("cold_runs_s"),
                        "loadavg_after": os.getloadavg(),
                        "cold_s": c, "warm_s": w, "cold_cpu_s": cpu[0], "warm_cpu_s": cpu[1],
                        "stats": st,
                        "cold_us_per_host_epoch": c / (h * e) * 1e6,
                        "warm_us_per_host_epoch": w / (h * e) * 1e6})
            shutil.rmtree(db, ignore_errors=True)
            os.unlink(db + ".json")
        self.res["curve"] = pts

    def export(self):
        h, e = (20, 6) if self.a.quick else (100, 24)
        db, meta = self.gen("fleet", h, e, 200, 4000)
        out = os.path.join(self.cache, "export-out")
        shutil.rmtree(out, ignore_errors=True)
        cmd = [self.exporter, "--db", db, "--epoch", "all", "--host", "all",
               "--format", "parquet", "--output", out, "--no-symbols"]
        log("export: first run")
        drop_caches()
        t = time.monotonic()
        r = run(cmd, timeout=7200)
        first = time.monotonic() - t
        if r.returncode != 0:
            raise RuntimeError(f"dcpiexport: {r.stderr[-800:]}")
        with open(os.path.join(out, "manifest.json")) as f:
            man = json.load(f)
        rows = sum(p.get("rows", 0) for p in man.get("partitions", {}).values())
        size = sum(bench.tree_bytes(os.path.join(out, "samples"))[:1])
        log("export: second run (nothing changed)")
        t = time.monotonic()
        r = run(cmd, timeout=7200)
        second = time.monotonic() - t
        self.res["export"] = {"rows": rows, "first_s": first, "rows_per_s": rows / first,
                              "parquet_bytes": size, "bytes_per_row": size / max(rows, 1),
                              "profile_bytes": meta["profile_bytes"],
                              "second_run_s": second, "second_stderr": r.stderr[-400:]}
        shutil.rmtree(out, ignore_errors=True)

    def main(self):
        if not self.a.no_build:
            self.build()
        for step in self.a.only.split(","):
            if step == "export" and self.a.skip_export:
                continue
            if step == "curve" and not self.a.curve:
                continue
            try:
                getattr(self, step)()
            except Exception as e:  # noqa: BLE001
                log(f"{step}: {e}")
                self.res.setdefault("errors", []).append(f"{step}: {e}")
        self.res["loadavg_at_end"] = os.getloadavg()
        ts = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
        p = os.path.join(BENCH, "results", f"fleet-{ts}.json")
        with open(p, "w") as f:
            json.dump(self.res, f, indent=1)
        md = self.markdown()
        with open(p[:-5] + ".md", "w") as f:
            f.write(md)
        print(md)
        log(f"wrote {p}")
        return 1 if self.res.get("errors") else 0

    def markdown(self):
        L = [f"`{self.res.get('command')}` at commit {self.res.get('commit')}, started "
             f"{self.res['started']}; load average {self.res['loadavg_at_start']} at the start, "
             f"{self.res.get('loadavg_at_end')} at the end; cold = median of {COLD_REPS} runs "
             f"after dropping the page cache, warm = median of {self.a.reps}\n"]
        r = self.res.get("reports")
        f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        mb = lambda x: "-" if x is None else f"{x / 1e6:.1f}"  # noqa: E731
        if r:
            L.append(f"Fleet {r['hosts']} hosts x {r['epochs']} epochs x 200 images "
                     f"({r['db']['profiles']} profiles, {r['db']['profile_bytes']} bytes; "
                     f"summaries {r['db']['summary_bytes']} bytes)\n")
            L.append("| report | cold s | warm s | cold CPU s | warm CPU s | profiles read | "
                     "summary indexes used | cold disk MB read |")
            L.append("|---|---|---|---|---|---|---|---|")
            for k in ("images_index", "images_old", "images_profiles", "symbols",
                      "symbols_old"):
                if k not in r:
                    continue
                x = r[k]
                L.append(f"| {k} | {f(x['cold_s'])} | {f(x['warm_s'])} | "
                         f"{f(x['cold_cpu_s'])} | {f(x['warm_cpu_s'])} | "
                         f"{x['stats'].get('profiles_read')} | "
                         f"{x['stats'].get('summary_indexes_used')} | "
                         f"{mb(x.get('cold_disk_bytes'))} |")
            L.append(f"\nper-image reports identical: summary.idx vs profiles {r['identical']}, "
                     f"vs previous build {r['identical_old']}; per-symbol vs previous build "
                     f"{r['identical_symbols_old']}; load average at start "
                     f"{self.res['loadavg_at_start']}\n")
        if self.res.get("curve"):
            L.append("| hosts x epochs | index entries | files read | summary.idx bytes | "
                     "cold disk MB read | cold s | warm s | "
                     "cold CPU s | warm CPU s | cold us/host-epoch | warm us/host-epoch |")
            L.append("|---|---|---|---|---|---|---|---|---|---|---|")
            for p in self.res["curve"]:
                L.append(f"| {p['hosts']} x {p['epochs']} | {p['entries']} | "
                         f"{p['files_read']} | {p['summary_idx_bytes']} | "
                         f"{mb(p.get('cold_disk_bytes'))} | {f(p['cold_s'])} | {f(p['warm_s'])} | "
                         f"{f(p['cold_cpu_s'])} | {f(p['warm_cpu_s'])} | "
                         f"{p['cold_us_per_host_epoch']:.0f} | {p['warm_us_per_host_epoch']:.0f} |")
        x = self.res.get("export")
        if x:
            L.append(f"\nexport: {x['rows']} rows in {x['first_s']:.2f} s = "
                     f"{x['rows_per_s']:.0f} rows/s; {x['parquet_bytes']} bytes of Parquet = "
                     f"{x['bytes_per_row']:.2f} bytes/row (profiles: {x['profile_bytes']} bytes); "
                     f"second run (no change) {x['second_run_s']:.2f} s")
        for e in self.res.get("errors", []):
            L.append(f"\nERROR {e}")
        return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 x 6 fleet, for a smoke test")
    ap.add_argument("--reps", type=int, default=3, help="warm runs per measurement")
    ap.add_argument("--cold-reps", type=int, default=3,
                    help="cold runs (page cache dropped before each) per measurement")
    ap.add_argument("--only", default="reports,curve,export", help="steps to run")
    ap.add_argument("--curve", default="100x24,250x24,500x30,1000x30",
                    help="HOSTSxEPOCHS points of the per-image curve ('' to skip)")
    ap.add_argument("--skip-export", action="store_true")
    ap.add_argument("--skip-profiles", action="store_true",
                    help="skip the per-image report from the profiles (database without index)")
    ap.add_argument("--old-prof", default="/var/tmp/dcpi-bench/dcpiprof-old",
                    help="a dcpiprof of an earlier build, timed on the same files side by side "
                         "(skipped when missing)")
    ap.add_argument("--no-build", action="store_true", help="use the release binaries as built")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("fleet.py: dropping the page cache needs root", file=sys.stderr)
        return 2
    global COLD_REPS
    COLD_REPS = max(1, a.cold_reps)
    return Fleet(a).main()


if __name__ == "__main__":
    sys.exit(main())
