#!/bin/sh
# Who table against the profiles on this machine's own activity (issue 16): dcpid with its
# defaults (no workload of ours) for SECONDS, a flush and the sizes every STEP seconds.
# Whatever runs on the machine meanwhile is the workload: run it while the machine is busy
# with many processes (builds, test suites). Needs root.
# Usage: bench/who_live.sh SECONDS STEP BIN_DIR WORK_DIR
set -eu
secs=$1 step=$2 bin=$3 work=$4
mkdir -p "$work"
"$bin/dcpid" --config none --db "$work/db" --spool "$work/spool" --socket "$work/s.sock" \
  --host live 2>"$work/dcpid.log" &
d=$!
trap 'kill $d 2>/dev/null || true; wait $d 2>/dev/null || true' EXIT
start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt "$secs" ]; do
  sleep "$step"
  "$bin/dcpictl" --socket "$work/s.sock" flush > /dev/null
  hd=$(ls -d "$work"/db/epochs/*/live | tail -1)
  who=$(stat -c %s "$hd/who.tbl")
  prof=$(cat "$hd"/*.prof | wc -c)
  procs=$(grep -c . /proc/loadavg >/dev/null; awk '{print $5}' /proc/loadavg)
  echo "$(date -u +%H:%M:%S) t=$(( $(date +%s) - start ))s who.tbl=$who B profiles=$prof B ($(ls "$hd"/*.prof | wc -l) files) ratio=$(awk "BEGIN {printf \"%.2f\", 100*$who/$prof}")% last_pid=$procs"
done
