#!/bin/sh
# Disk cost of the per-command profiles (by_command, on by default; FORMAT.md §5.6) against the
# flat profiles of the same host directory (issue 38 item 1).
# Usage: bench/percommand_size.sh SECONDS SNAPSHOT_EVERY MODE BIN_DIR
#   MODE mix: the busy mix of bench/disk.py (a `cc -O2` loop over bench/workloads/*.c and a
#             Python loop), beside whatever else the machine runs;
#   MODE live: no load of its own: the machine's own processes.
#   BIN_DIR holds dcpid and dcpictl (release builds: `cargo build --release -p dcpi-daemon
#   -p dcpi-client --bins`, then target/release). DCPID and DCPICTL name the binaries in it
#   (default dcpid and dcpictl; a copy under another name survives a `pkill dcpid` run by
#   someone else on a shared machine).
# Two dcpid run side by side on the same load: one with its defaults (only the sandbox paths
# and host name are given), one with `--by-command false` (for its CPU time). At each
# snapshot: `dcpictl flush` of both, then one line: elapsed seconds, the default daemon's flat
# profiles (bytes, files, 1 KiB blocks allocated), its per-command profiles (same), its
# who.tbl and slices.log bytes, the per-command bytes as a share of the flat ones, and the
# CPU seconds (utime + stime) of the default daemon and of the one without per-command
# profiles, then the sole-command stubs among the per-command files (FORMAT.md §5.6.1) and the
# bytes of the flat profiles they stand for (what copies would have cost). Needs root
# (perf_event_open system-wide).
set -eu
secs=${1:-600}
every=${2:-120}
mode=${3:-mix}
bin=${4:?BIN_DIR}
DCPID=${DCPID:-dcpid}
DCPICTL=${DCPICTL:-dcpictl}
root=$(cd "$(dirname "$0")/.." && pwd)
t=$(mktemp -d)
load=; d=; d0=
trap 'for p in $load; do kill -9 -$p 2>/dev/null || true; done; kill $d $d0 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $t' EXIT
"$bin/$DCPID" --config none --db $t/db --spool $t/spool --socket $t/s.sock --host bench \
  2>$t/dcpid.log &
d=$!
"$bin/$DCPID" --config none --db $t/db0 --spool $t/spool0 --socket $t/s0.sock --host bench \
  --by-command false 2>$t/dcpid0.log &
d0=$!
sleep 2
if [ "$mode" = mix ]; then
  mkdir -p $t/cc-out
  srcs="$root/bench/workloads/churn.c $root/bench/workloads/cpu.c $root/bench/workloads/mem.c $root/bench/workloads/mix.c"
  setsid sh -c "while :; do for f in $srcs; do cc -O2 -c \"\$f\" -o $t/cc-out/x.o 2>/dev/null; done; done" &
  load="$load $!"
  printf 's=0\nfor i in range(300000):\n    s += i * i\nprint(s)\n' > $t/loop.py
  setsid sh -c "while :; do python3 $t/loop.py >/dev/null; done" &
  load="$load $!"
fi
sizes() { # PATTERN EXCLUDE -> "bytes files blocks"
  find $t/db -name "$1" ! -name "$2" -type f -printf '%s %k\n' |
    awk '{b += $1; k += $2; n++} END {printf "%d %d %d", b, n, k}'
}
start=$(date +%s)
echo "# mode=$mode dcpid=$bin/$DCPID $(date -u +%FT%TZ) nproc=$(nproc)"
echo "# elapsed_s flat_bytes flat_files flat_kib cmd_bytes cmd_files cmd_kib who_bytes slices_bytes cmd/flat cpu_s cpu_s_without stubs stubbed_flat_bytes"
stubs() { # -> "stubs bytes of the flat profiles they stand for"
  python3 - "$t/db" <<'PY'
import os, sys
n = b = 0
for d, _, fs in os.walk(sys.argv[1]):
    for f in fs:
        if ".cmd-" in f and f.endswith(".prof"):
            p = os.path.join(d, f)
            with open(p, "rb") as h:
                head = h.read(10)
            if head[:8] == b"DCPIPROF" and int.from_bytes(head[8:10], "little") == 4:
                n += 1
                flat = os.path.join(d, f.rsplit(".", 2)[0] + ".prof")
                b += os.path.getsize(flat) if os.path.exists(flat) else 0
print(n, b)
PY
}
cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14 + $15) / hz}' /proc/$1/stat; }
while :; do
  sleep "$every"
  # A loaded machine's disk can keep a flush from completing within dcpictl's 20 s: the
  # snapshot is then of what was published (the rest follows in the next one).
  "$bin/$DCPICTL" --socket $t/s.sock flush >/dev/null || echo "# flush incomplete" >&2
  "$bin/$DCPICTL" --socket $t/s0.sock flush >/dev/null || true
  now=$(($(date +%s) - start))
  set -- $(sizes '*.prof' '*.*.*.prof') $(sizes '*.cmd-*.prof' 'x')
  who=$(find $t/db -name who.tbl -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  sl=$(find $t/db -name slices.log -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  share=$(awk -v c="$4" -v f="$1" 'BEGIN {printf "%.1f%%", f ? 100 * c / f : 0}')
  echo "$now $1 $2 $3 $4 $5 $6 $who $sl $share $(cpu $d) $(cpu $d0) $(stubs)"
  [ "$now" -ge "$secs" ] && break
done
