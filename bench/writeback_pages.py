#!/usr/bin/env python3
"""Pages a dcpid dirtied, by file kind, from `perf record -e writeback:writeback_dirty_folio -p PID`
(BENCHMARKS.md "Storage and writes over an hour"): python3 bench/writeback_pages.py PERF_DATA DB_DIR.
Inodes of files that still exist under DB_DIR are named; block-device pages (ext4 metadata) and
files replaced since (profiles rewritten whole) are grouped. The stop's own publish is left out."""
import subprocess, re, collections, os, sys, glob
data = sys.argv[1]; db = sys.argv[2]
out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,time,event,trace"], capture_output=True, text=True).stdout
# inode -> path for the files that still exist
ino = {}
for d, _, fs in os.walk(db):
    for f in fs:
        p = os.path.join(d, f)
        try: ino[os.stat(p).st_ino] = p
        except OSError: pass
pages = collections.Counter(); byth = collections.Counter()
first = last = None
for line in out.splitlines():
    if 'writeback_dirty_folio' not in line: continue
    m = re.search(r'ino=(\d+)', line)
    t = re.search(r' (\d+\.\d+):', line)
    if t:
        tt = float(t.group(1)); first = tt if first is None else first; last = tt
    comm = line.split()[0]
    if comm == 'dcpid-stop': continue
    i = int(m.group(1))
    p = ino.get(i)
    if p is None:
        kind = 'metadata (block device pages)' if i > 100000000 else 'files since replaced or removed (profiles, summaries rewritten whole)'
    else:
        b = os.path.basename(p)
        kind = 'slice files' if b.startswith('slices') else ('one-time (binaries/, kallsyms/)' if '/binaries/' in p or '/kallsyms/' in p else 'live files: ' + re.sub(r'[0-9a-f]{16,}', 'H', b))
    pages[kind] += 1; byth[comm] += 1
span = (last - first) if first is not None else 0
print(f"span {span:.0f} s")
tot = sum(pages.values())
for k, v in pages.most_common(20):
    print(f"{v*4096/1e6*3600/max(span,1):8.2f} MB/h  {v:6d} pages  {100*v/tot:5.1f} %  {k}")
print(byth.most_common())
