#!/bin/bash
# Whole-daemon cost of `dcpictl top` (issue 38): dcpid's CPU time with and without a client
# requesting at 2 refreshes per second, in alternating phases.
# Two processes run a million nops each, so most samples are new (pid, pc) pairs.
# usage: bench/top_cost.sh DCPID DCPICTL [PERIOD_NS] [PHASE_S] [ROUNDS]  (as root)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
DCPID=$1 CTL=$2 PERIOD=${3:-100000} PHASE=${4:-30} ROUNDS=${5:-2}
W=$(mktemp -d /tmp/topcost-run.XXXXXX)
mkdir -p $W/db $W/spool
printf 'int main(void) {\n    for (;;)\n        __asm__ volatile(".rept 1048576\\n nop\\n .endr");\n}\n' > $W/nops.c
cc -O1 -o $W/nops $W/nops.c || exit 1
"$DCPID" --db $W/db --spool $W/spool --host m --socket $W/s.sock -e cpu-clock:$PERIOD \
    --flush-interval 5s > $W/log 2>&1 &
D=$!
for i in $(seq 100); do [ -S $W/s.sock ] && "$CTL" --socket $W/s.sock status >/dev/null 2>&1 && break; sleep 0.2; done
$W/nops & N1=$!
$W/nops & N2=$!
sleep 10
tick=$(getconf CLK_TCK)
cpu() { awk -v t=$tick '{print ($14+$15)/t}' /proc/$D/stat; }
entries() { "$CTL" --socket $W/s.sock status --json | python3 -c 'import json,sys; v=json.load(sys.stdin); print(v["aggregation"]["entries_created"], v["samples"])'; }
for r in $(seq $ROUNDS); do
  for mode in idle client; do
    c0=$(cpu); e0=$(entries); t0=$(date +%s.%N); n=0
    end=$(( $(date +%s) + PHASE ))
    if [ $mode = client ]; then
      read n rows slow < <(python3 "$HERE/top_watch.py" $W/s.sock $PHASE)
    else
      sleep $PHASE; rows=-; slow=-
    fi
    c1=$(cpu); e1=$(entries); t1=$(date +%s.%N)
    python3 - "$mode" "$c0" "$c1" "$t0" "$t1" "$n" "$e0" "$e1" "$rows" "$slow" <<'PY'
import sys
mode, c0, c1, t0, t1, n = sys.argv[1], *map(float, sys.argv[2:6]), int(sys.argv[6])
rows, slow = sys.argv[9], sys.argv[10]
e0, s0 = map(int, sys.argv[7].split()); e1, s1 = map(int, sys.argv[8].split())
secs = t1 - t0
print(f"{mode:6} {secs:5.1f}s dcpid cpu {100*(c1-c0)/secs:6.2f}% of one CPU, requests {n} ({n/secs:.2f}/s), "
      f"samples {(s1-s0)/secs:.0f}/s, table entries {(e1-e0)/secs:.0f}/s ({5*(e1-e0)/secs:.0f} per 5 s), "
      f"rows {rows}, slowest answer {slow} ms")
PY
  done
done
kill $N1 $N2; kill -INT $D; wait $D; rm -rf $W
