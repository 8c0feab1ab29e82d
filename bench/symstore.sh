#!/usr/bin/env bash
# Symbol store benchmark (BENCHMARKS.md "Symbol store", issue 39):
#  1. size: the tables of every ELF image mapped by a running process here, and for a fleet of
#     100 hosts running the same images (stored once): daemon/examples/symstore_size.rs;
#  2. cost: dcpid started on a fresh database, the symbol store thread's CPU time and the bytes
#     under <db>/binaries every 10 s for the first minute and in steady state.
#   bench/symstore.sh [SECONDS]      (default 180; needs root; builds with $CARGO_TARGET_DIR)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"
secs="${1:-180}"
profile="${PROFILE:-debug}"
flag=(); [ "$profile" = release ] && flag=(--release)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
cargo build "${flag[@]}" --quiet -p dcpi-daemon --bin dcpid --example symstore_size
bin="$CARGO_TARGET_DIR/$profile"

echo "== size (this machine's running images; fleet of 100 hosts)"
"$bin/examples/symstore_size" --hosts 100

echo "== cost over ${secs}s after start (t, symstore thread CPU s, bytes in binaries/, tables)"
tmp="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
"$bin/dcpid" --config none --db "$tmp/db" --spool "$tmp/spool" --socket "$tmp/sock" \
    --host bench --flush-interval 1s >/dev/null 2>&1 &
pid=$!
tck=$(getconf CLK_TCK)
for ((t = 10; t <= secs; t += 10)); do
    sleep 10
    cpu=0
    for task in /proc/$pid/task/*; do
        if [ "$(cat "$task/comm" 2>/dev/null)" = dcpid-symstore ]; then
            cpu=$(awk -v hz="$tck" '{print ($14 + $15) / hz}' "$task/stat")
        fi
    done
    bytes=$(find "$tmp/db/binaries" -name '*.sym' -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}')
    n=$(find "$tmp/db/binaries" -name '*.sym' 2>/dev/null | wc -l)
    echo "$t $cpu $bytes $n"
done
