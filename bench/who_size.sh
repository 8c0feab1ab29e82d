#!/bin/sh
# Disk size of the who table against the profiles of the same host directory, on a machine
# busy with many short processes (issue 16). Usage: bench/who_size.sh [SECONDS] [BY_PID]
# Needs root (perf_event_open system-wide, cgroup v2 mkdir). Prints one line per snapshot.
set -eu
secs=${1:-180}
by_pid=${2:-false}
root=$(cd "$(dirname "$0")/.." && pwd)
dcpid=$root/target/debug/dcpid
dcpictl=$root/target/debug/dcpictl
t=$(mktemp -d)
load=; d=
trap 'kill $load $d 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $t' EXIT
cat > $t/spin.c <<'C'
#include <stdlib.h>
#include <time.h>
int main(int c, char **v) { double w = c > 1 ? atof(v[1]) : 0.02; struct timespec t;
  volatile unsigned long s = 0; do { for (int i = 0; i < 10000; i++) s += i ^ (s >> 3);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); } while (t.tv_sec + t.tv_nsec / 1e9 < w); return 0; }
C
cc -O1 -o $t/spin $t/spin.c
mkdir $t/bin
i=0; while [ $i -lt 300 ]; do ln -s $t/spin $t/bin/job$i; i=$((i+1)); done
v2=$(awk '$0 ~ / - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
"$dcpid" --config none --db $t/db --spool $t/spool --socket $t/s.sock --host bench \
  --events cpu-clock:1000000 --by-pid "$by_pid" 2>$t/dcpid.log &
d=$!
sleep 2
# 300 commands x 20 cgroups, short processes, plus common tools (more images).
(
  n=0
  while :; do
    g=$v2/dcpi-who-bench-$((n % 20)); mkdir -p $g 2>/dev/null || true
    sh -c "echo \$\$ > $g/cgroup.procs 2>/dev/null; exec $t/bin/job$((n % 300)) 0.02"
    ls /usr/bin > /dev/null; grep -c a /etc/passwd > /dev/null
    n=$((n+1))
  done
) &
load=$!
start=$(date +%s)
report() {
  "$dcpictl" --socket $t/s.sock flush > /dev/null
  hd=$(ls -d $t/db/epochs/*/bench)
  who=$(stat -c %s $hd/who.tbl)
  prof=$(cat $hd/*.prof | wc -c)
  echo "t=$(( $(date +%s) - start ))s by_pid=$by_pid who.tbl=$who B profiles=$prof B ($(ls $hd/*.prof | wc -l) files) ratio=$(awk "BEGIN {printf \"%.2f\", 100*$who/$prof}")%"
}
half=$((secs / 2))
sleep $half; report
sleep $((secs - half)); report
kill $load; wait $load 2>/dev/null || true
for g in $v2/dcpi-who-bench-*; do rmdir $g 2>/dev/null || true; done
