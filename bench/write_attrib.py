#!/usr/bin/env python3
"""Where dcpid's written bytes go, per file kind (issue 36 "Writes", issue 38's disk budget).

Runs one dcpid (the defaults of bench/slices.py's slices-on daemon: 1 kHz per CPU, cpu-clock,
`--config none`) on the busy mix of bench/slices.py, under `strace -f --seccomp-bpf -y`
restricted to the writing system calls (write, pwrite64, writev, pwritev, fsync, fdatasync,
rename*, link*, unlink*), for --duration seconds after --warmup seconds. Every write is
attributed to the file it finally lands in: a `write_atomic` temporary (`.tmp-*`) takes the
name it is renamed (or hard-linked) to. Files are grouped into kinds (spool, flat profiles,
per-command/per-process profiles, slices segments, who table, stacks, binaries/ symbol tables,
kallsyms snapshot, summaries, markers...).

Why strace and not bpftrace kprobes: this kernel has no CONFIG_KPROBES and tracefs'
available_filter_functions is not readable here, so neither kprobe: nor kfunc: attach;
syscall tracepoints would lose the rename target of long paths (bpftrace strings are cut).
strace stops dcpid only at the traced calls (seccomp-bpf), so it does not change what is
written, only when.

The spool is put on a tmpfs (/dev/shm, as the systemd unit's RuntimeDirectory /run/dcpid does
in production: README "Files"), so /proc/PID/io write_bytes (page-cache pages dirtied on a
block device; tmpfs pages are not counted) is the database's device writes; the spool's bytes
are still listed, apart. write_bytes counts whole pages dirtied: a small append to a page
already written back costs 4 KB there, so it can exceed the logical bytes.

  sudo python3 bench/write_attrib.py --duration 600 --bin-dir /work/tgt/writes/debug

Writes bench/results/write-attrib-<timestamp>.json and .md and prints the table.
"""

import argparse
import collections
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
import slices  # noqa: E402

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
CALLS = "write,pwrite64,writev,pwritev,pwritev2,fsync,fdatasync,rename,renameat,renameat2,link,linkat,unlink,unlinkat"

LINE = re.compile(r"^(\d+)\s+(?:(\w+)\((.*)|<\.\.\. (\w+) resumed>(.*))$")
FD = re.compile(r"^\d+<([^>]*)>")
RET = re.compile(r"\)\s+=\s+(-?\d+)")
STRS = re.compile(r'"((?:[^"\\]|\\.)*)"')


def kind(path, db, spool):
    """The kind of a final path."""
    if path.startswith(spool):
        return "spool (tmpfs)"
    if not path.startswith(db):
        return "other: " + path
    rel = os.path.relpath(path, db)
    base = os.path.basename(rel)
    parts = rel.split(os.sep)
    if parts[0] == "binaries":
        return "binaries/ (symbol tables, one-time per build-id)"
    if base.startswith("slices.") and base.endswith(".log"):
        return "slices segments"
    if "kallsyms" in base:
        return "kallsyms snapshot (one-time per boot+epoch)"
    if base.endswith(".prof"):
        stem = base[: -len(".prof")]
        if re.search(r"\.(cmd|pid|cg)-[0-9a-f]+$", stem):
            return "per-command/process/cgroup profiles"
        if stem.startswith("unknown"):
            return "unknown profiles"
        return "flat profiles"
    if base == "who-profiles.pack":
        return "per-command/process/cgroup profiles (pack, FORMAT.md §15)"
    if base.startswith("who"):
        return "who table"
    if "stack" in base:
        return "stacks"
    if base.startswith("fresh"):
        return "fresh marks"
    if "summary" in base:
        return "summaries"
    return "other db: " + base


def parse(trace, db, spool):
    """Per final path: logical bytes, write calls, fsyncs; counts of renames, links."""
    unfinished = {}
    writes = []  # (path, bytes)
    fsyncs = []  # path
    renames = []  # (old, new)
    links = []
    unlinks = 0
    with open(trace, errors="replace") as f:
        for raw in f:
            m = LINE.match(raw.rstrip("\n"))
            if not m:
                continue
            pid = m.group(1)
            if m.group(2):
                call, rest = m.group(2), m.group(3)
                if rest.endswith("<unfinished ...>"):
                    unfinished[pid] = (call, rest[: -len("<unfinished ...>")])
                    continue
            else:
                call = m.group(4)
                head = unfinished.pop(pid, (call, ""))
                rest = head[1] + m.group(5)
            r = RET.search(rest)
            if not r or int(r.group(1)) < 0:
                continue
            ret = int(r.group(1))
            if call in ("write", "pwrite64", "writev", "pwritev", "pwritev2"):
                fd = FD.match(rest)
                if fd:
                    writes.append((fd.group(1), ret))
            elif call in ("fsync", "fdatasync"):
                fd = FD.match(rest)
                if fd:
                    fsyncs.append(fd.group(1))
            elif call.startswith("rename") or call.startswith("link"):
                s = STRS.findall(rest)
                if len(s) >= 2:
                    (renames if call.startswith("rename") else links).append((s[0], s[1]))
            elif call.startswith("unlink"):
                unlinks += 1
    final = {}
    for old, new in renames + links:
        final[old] = new
    rows = collections.defaultdict(lambda: {"bytes": 0, "writes": 0, "fsyncs": 0, "files": set()})
    for path, n in writes:
        p = final.get(path, path)
        k = kind(p, db, spool)
        rows[k]["bytes"] += n
        rows[k]["writes"] += 1
        rows[k]["files"].add(p)
    for path in fsyncs:
        p = final.get(path, path)
        rows[kind(p, db, spool)]["fsyncs"] += 1
    dir_fsyncs = sum(1 for p in fsyncs if os.path.isdir(p))
    ren_kinds = collections.Counter(kind(n, db, spool) for _, n in renames)
    out = {k: {"bytes": v["bytes"], "writes": v["writes"], "fsyncs": v["fsyncs"],
               "distinct_files": len(v["files"])} for k, v in rows.items()}
    return out, {"renames": len(renames), "links": len(links), "unlinks": unlinks,
                 "fsyncs": len(fsyncs), "dir_fsyncs_among_them": dir_fsyncs,
                 "renames_by_kind": dict(ren_kinds)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--warmup", type=float, default=60)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "target", "debug"))
    ap.add_argument("--spool-dir", default="/dev/shm",
                    help="parent of the spool (a tmpfs, as in production); default /dev/shm")
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep the work directory and the trace")
    ap.add_argument("extra", nargs="*", help="extra dcpid arguments (after --)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/write_attrib.py: must run as root", file=sys.stderr)
        return 2
    bins = {n: os.path.join(args.bin_dir, n) for n in ("dcpid", "dcpictl")}
    work = tempfile.mkdtemp(prefix="dcpi-wattr-", dir="/var/tmp")
    spool = tempfile.mkdtemp(prefix="dcpi-wattr-spool-", dir=args.spool_dir)
    trace = os.path.join(work, "strace.out")
    life = args.warmup + args.duration + 600
    d = slices.Dcpid(bins, os.path.join(work, "d"), args.rate, life, args.extra)
    d.spool_dir = spool
    os.makedirs(d.dir, exist_ok=True)
    base_cmd = d.cmd

    def cmd():
        return ["strace", "-f", "--seccomp-bpf", "-y", "-s", "0", "-o", trace,
                "-e", "trace=" + CALLS] + base_cmd()

    d.cmd = cmd
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    d.start()
    # The daemon is strace's child.
    kids = open(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read().split()
    dpid = int(kids[0])
    mix = slices.busy_mix(os.path.join(work, "mix"))
    try:
        time.sleep(args.warmup)
        # Pages dirtied per inode (what write_bytes counts), through a tracepoint: kprobes are
        # not available on this kernel, tracepoints are.
        bt = subprocess.Popen(
            ["bpftrace", "-e", "tracepoint:writeback:writeback_dirty_folio /pid == %d/ "
             "{ @p[args->ino] = count(); @bdi[args->name] = count(); "
             "}" % dpid],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(5)
        io0 = bench.proc_io(dpid)
        with open(trace, "a"):
            pass
        mark = os.path.getsize(trace)
        t0 = time.monotonic()
        time.sleep(args.duration)
        io1 = bench.proc_io(dpid)
        bt.send_signal(2)
        bt_out = bt.communicate(timeout=60)[0]
        secs = time.monotonic() - t0
        cut = os.path.join(work, "window.out")
        with open(trace, "rb") as f, open(cut, "wb") as g:
            f.seek(mark)
            # Skip a partial first line.
            f.readline()
            shutil.copyfileobj(f, g)
    finally:
        slices.stop_mix(mix)
    # SIGTERM to the daemon itself (strace forwards nothing), then strace exits with it.
    os.kill(dpid, 15)
    d.proc.wait(timeout=300)
    db = os.path.realpath(d.db)
    rows, counts = parse(cut, db + os.sep, os.path.realpath(spool) + os.sep)
    inos = {}
    for root in (db, os.path.realpath(spool)):
        for dd, _, fs in os.walk(root):
            for n in fs:
                pth = os.path.join(dd, n)
                try:
                    inos[os.lstat(pth).st_ino] = pth
                except OSError:
                    pass
    pages = collections.Counter()
    for m in re.finditer(r"@p\[(\d+)\]: (\d+)", bt_out):
        pth = inos.get(int(m.group(1)))
        k = kind(pth, db + os.sep, os.path.realpath(spool) + os.sep) if pth else \
            "replaced or removed since (atomic rewrites of profiles, who, fresh, summary)"
        pages[k] += int(m.group(2))
    hour = 3600.0 / secs
    total_db = sum(v["bytes"] for k, v in rows.items() if not k.startswith("spool"))
    res = {"commit": rev, "label": args.label, "window_s": secs, "rate": args.rate,
           "cpus": os.cpu_count(), "loadavg_end": os.getloadavg(), "extra": args.extra,
           "write_bytes": io1.get("write_bytes", 0) - io0.get("write_bytes", 0),
           "wchar": io1.get("wchar", 0) - io0.get("wchar", 0),
           "db_logical_bytes": total_db, "rows": rows, "counts": counts,
           "folios_dirtied_by_kind": dict(pages)}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.join(BENCH, "results", f"write-attrib-{stamp}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# dcpid writes per file kind, commit {rev} {args.label}, {stamp}", "",
          f"`python3 bench/write_attrib.py --duration {args.duration:g} --warmup {args.warmup:g} "
          f"--rate {args.rate}{' -- ' + ' '.join(args.extra) if args.extra else ''}`, "
          f"window {secs:.0f} s, load at end {os.getloadavg()[0]:.1f}", "",
          "| kind | MB/h (logical) | share of db | write calls/h | fsyncs/h | distinct files |",
          "|---|---|---|---|---|---|"]
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1]["bytes"]):
        share = "" if k.startswith("spool") else f"{100.0 * v['bytes'] / max(1, total_db):.1f} %"
        md.append(f"| {k} | {v['bytes'] * hour / 1e6:.2f} | {share} | {v['writes'] * hour:.0f} | "
                  f"{v['fsyncs'] * hour:.0f} | {v['distinct_files']} |")
    md += ["", f"- database, logical: {total_db * hour / 1e6:.2f} MB/h; /proc/PID/io write_bytes "
           f"(pages dirtied, spool on tmpfs not counted): {res['write_bytes'] * hour / 1e6:.2f} MB/h; "
           f"wchar {res['wchar'] * hour / 1e6:.2f} MB/h",
           f"- per hour: renames {counts['renames'] * hour:.0f}, links {counts['links'] * hour:.0f}, "
           f"unlinks {counts['unlinks'] * hour:.0f}, fsyncs {counts['fsyncs'] * hour:.0f} "
           f"(of directories {counts['dir_fsyncs_among_them'] * hour:.0f})"]
    md += ["", "```", re.sub(r"@p\[\d+\]: \d+\n", "", bt_out)[-6000:], "```"]
    md += ["", "Folios dirtied (writeback_dirty_folio, x 4 KB), per kind of the file's inode at the end:",
           "", "| kind | MB/h as 4 KB pages |", "|---|---|"]
    for k, v in pages.most_common():
        md.append(f"| {k} | {v * 4096 * hour / 1e6:.2f} |")
    text = "\n".join(md) + "\n"
    with open(out + ".md", "w") as f:
        f.write(text)
    print(text)
    if args.keep:
        print(f"kept {work} and {spool}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(spool, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
