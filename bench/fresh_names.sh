#!/bin/bash
# What fresh-by-default costs dcpid (issue 36 item 6, FORMAT.md §7.3): how often and how big
# `fresh.json` is written, against the slices appended, over MINUTES of default settings with
# exec churn (a new binary, hence a new image, every CHURN seconds) beside a busy loop.
# usage: bench/fresh_names.sh [MINUTES=4] [CHURN=10]   (root; binaries in $CARGO_TARGET_DIR)
set -eu
MIN=${1:-4}; CHURN=${2:-10}
T=${CARGO_TARGET_DIR:-target}/${PROFILE:-debug}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
"$T/dcpid" --config none --db "$W/db" --spool "$W/spool" --socket "$W/sock" --host h1 -v \
    2> "$W/log" &
for _ in $(seq 600); do [ -S "$W/sock" ] && break; sleep 0.2; done
sleep 2
"$T/dcpictl" --socket "$W/sock" epoch new > /dev/null
sh -c 'while :; do :; done' & BUSY=$!
end=$(( $(date +%s) + MIN * 60 )); i=0
while [ "$(date +%s)" -lt "$end" ]; do
    i=$((i + 1))
    printf 'volatile int s=%d;int main(){for(long i=0;i<30000000;i++)s+=i;return 0;}\n' $i > "$W/p$i.c"
    cc -O1 -o "$W/p$i" "$W/p$i.c" && "$W/p$i"
    sleep "$CHURN"
done
kill $BUSY
line=$(grep "time slices appended" "$W/log" | tail -1)
hd=$(ls -d "$W"/db/epochs/*/h1 | tail -1)
echo "minutes=$MIN new_images=$i"
echo "$line" | grep -o 'total_records=[0-9]*\|total_bytes=[0-9]*\|names_writes=[0-9]*\|names_bytes=[0-9]*' | tr '\n' ' '; echo
echo "fresh.json now: $(stat -c %s "$hd/fresh.json" 2>/dev/null || echo none) bytes; slices.log: $(stat -c %s "$hd/slices.log") bytes"
start=$(date +%s%N); "$T/dcpiprof" --db "$W/db" --host h1 > /dev/null; end=$(date +%s%N)
echo "plain dcpiprof (fresh merge): $(( (end - start) / 1000000 )) ms"
"$T/dcpiprof" --db "$W/db" --host h1 | grep -c "$W/p" | sed 's/^/new images named by the report: /'
