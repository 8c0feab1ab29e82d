#!/bin/bash
# What dcpid's threads cost while two copies of bench/workloads/cpu.c run, per thread, in ms of
# CPU per second of wall time (schedstat), for one dcpid command line; to compare settings of
# the call-stack path (issue 37) one at a time:
#   bench/drain_cost.sh DCPID SECONDS [dcpid args...]
#   bench/drain_cost.sh target/release/dcpid 15 --callchains dwarf --stack-one-in 4 --ring-pages 512
# The workload is built without frame pointers unless WORKLOAD_FP=1. dcpid samples at 1 kHz
# (cpu-clock:1000000) and settles 8 s before the window.
set -euo pipefail
DCPID=$(readlink -f "$1"); SECS=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d /tmp/dcpi-drain-cost.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$W"' EXIT
FP=-fomit-frame-pointer; [ "${WORKLOAD_FP:-0}" = 1 ] && FP=-fno-omit-frame-pointer
cc -O2 $FP -o "$W/cpu" "$HERE/workloads/cpu.c"
"$DCPID" --config none --db "$W/db" --spool "$W/spool" --socket "$W/ctl.sock" --host bench \
  -e cpu-clock:1000000 "$@" > "$W/log" 2>&1 &
D=$!
for _ in $(seq 300); do [ -S "$W/ctl.sock" ] && break; sleep 0.1; done
sleep 8
snap() { for t in /proc/$D/task/*; do echo "$(cat $t/comm) $(cut -d' ' -f1 $t/schedstat)"; done | sort; }
"$W/cpu" 100000000000 > /dev/null & W1=$!
"$W/cpu" 100000000000 > /dev/null & W2=$!
A=$(snap); T0=$(date +%s.%N)
sleep "$SECS"
B=$(snap); T1=$(date +%s.%N)
kill $W1 $W2
python3 - "$T0" "$T1" "$(cat /proc/loadavg)" "$*" <<PY
import sys
t0, t1, load, args = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
def parse(s):
    d = {}
    for l in s.strip().splitlines():
        k, v = l.rsplit(" ", 1)
        d[k] = d.get(k, 0) + int(v)
    return d
a, b = parse("""$A"""), parse("""$B""")
per = {k: (b[k] - a.get(k, 0)) / 1e6 / (t1 - t0) for k in b}
print(f"args: {args}; load {load}")
print("total ms/s %.3f; " % sum(per.values()) + ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items()) if v >= 0.001))
PY
kill -INT $D; wait $D || true
