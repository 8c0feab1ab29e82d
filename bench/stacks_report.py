#!/usr/bin/env python3
"""Time dcpiprof's call-stack reports on a database with stacks (dcpid --callchains fp).

    python3 bench/stacks_report.py DCPIPROF DB HOST [SYM] [CALLER]

Runs `--callers SYM`, `--callees CALLER` (JSON) and `--format folded`, each 3 times with a
fresh symbol cache ("cold": symbol tables built from the binaries) and 3 times with a warm one,
and prints for each the best wall time and the best CPU time (user + sys of dcpiprof), in
seconds. CPU time is the figure to compare on a loaded machine. The outputs of the last run of
each are left in ./stacks_report.<kind>.out for comparing two binaries.
"""
import os
import resource
import subprocess
import sys
import tempfile
import time

prof, db, host = sys.argv[1:4]
sym = sys.argv[4] if len(sys.argv) > 4 else "hot"
caller = sys.argv[5] if len(sys.argv) > 5 else "via_a"
tmp = tempfile.mkdtemp()
cache = os.path.join(tmp, "cache.sqlite")


def once(args, out):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(out, "wb") as f:
        subprocess.run([prof, "--db", db, "--host", host, "--symbol-cache", cache, *args],
                       stdout=f, stderr=subprocess.DEVNULL, check=True)
    t1 = time.monotonic()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


kinds = [("callers", ["--callers", sym, "--format", "json"]),
         ("callees", ["--callees", caller, "--format", "json"]),
         ("folded", ["--format", "folded"])]
for mode in ("cold", "warm"):
    for name, args in kinds:
        runs = []
        for _ in range(3):
            if mode == "cold" and os.path.exists(cache):
                os.remove(cache)
            elif mode == "warm" and not os.path.exists(cache):
                once(["--format", "folded"], os.devnull)
            runs.append(once(args, f"stacks_report.{name}.out"))
        print(f"{name:8} {mode}: wall {min(r[0] for r in runs):6.2f} s, "
              f"cpu {min(r[1] for r in runs):6.2f} s", flush=True)
