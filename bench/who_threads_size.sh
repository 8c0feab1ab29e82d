#!/bin/sh
# Disk cost of the who table's thread rows (FORMAT.md §12 version 2, issue 38 item 1): run
# dcpid with default settings for SECONDS over this machine's own processes (whatever runs:
# builds, tests, services), flush, and print who.tbl's size as written and the size of the
# same table without its thread rows (what a dcpid without thread names writes), with the
# rows, thread rows and distinct thread names. Sizes do not depend on the machine's load or
# on the build (debug or release); the counts do depend on what ran.
# Usage: bench/who_threads_size.sh [SECONDS] [BY_PID]   (needs root: perf_event_open -a)
# Binaries from $CARGO_TARGET_DIR/debug (default target/debug): build them first
# (cargo build -p dcpi-daemon -p dcpi-client --bins; cargo build -p dcpi-profile-format
# --example who_threads_size).
set -eu
secs=${1:-600}
by_pid=${2:-false}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/debug
t=$(mktemp -d)
d=
trap 'kill $d 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $t' EXIT
"$bin/dcpid" --config none --db $t/db --spool $t/spool --socket $t/s.sock --host bench \
  --by-pid "$by_pid" 2>$t/dcpid.log &
d=$!
sleep "$secs"
n=0
until "$bin/dcpictl" --socket $t/s.sock flush > /dev/null 2>&1; do
  n=$((n+1)); [ $n -lt 36 ] || { echo "flush failed" >&2; exit 1; }; sleep 5
done
echo "seconds=$secs by_pid=$by_pid uptime:$(uptime)"
"$bin/examples/who_threads_size" --names ${NAMES:-0} $t/db/epochs/*/bench/who.tbl
