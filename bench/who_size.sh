#!/bin/sh
# Disk size of the who table, and of the per-process (by_pid) and per-cgroup (by_cgroup)
# profiles, against the flat profiles of the same host directory, on a machine busy with many
# short processes (issue 16). Usage: bench/who_size.sh [SECONDS] [BY_PID] [BY_CGROUP] [MODE]
# MODE churn (default): a loop starting short processes without end; steady: 20 long-running
# processes (the same 20 commands and cgroups) for the whole run, as a machine of services.
# Needs root (perf_event_open system-wide, cgroup v2 mkdir). Prints one line per snapshot:
# bytes (sum of file sizes) and the space allocated on disk (du, 4 KiB blocks on most file
# systems: what many small files really cost).
set -eu
secs=${1:-180}
by_pid=${2:-false}
by_cgroup=${3:-false}
mode=${4:-churn}
root=$(cd "$(dirname "$0")/.." && pwd)
dcpid=$root/target/debug/dcpid
dcpictl=$root/target/debug/dcpictl
t=$(mktemp -d)
load=; d=
trap 'kill $load $d 2>/dev/null || true; wait 2>/dev/null || true; rm -rf $t
  for g in $v2/dcpi-who-bench-*; do rmdir $g 2>/dev/null || true; done' EXIT
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
  --events cpu-clock:1000000 --by-pid "$by_pid" --by-cgroup "$by_cgroup" 2>$t/dcpid.log &
d=$!
sleep 2
if [ "$mode" = steady ]; then
  # 20 commands x 20 cgroups, one long-running process each.
  n=0
  while [ $n -lt 20 ]; do
    g=$v2/dcpi-who-bench-$n; mkdir -p $g 2>/dev/null || true
    sh -c "echo \$\$ > $g/cgroup.procs 2>/dev/null; exec $t/bin/job$n 100000" &
    load="$load $!"
    n=$((n+1))
  done
else
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
fi
start=$(date +%s)
paused=0
# Bytes, files and allocated KiB of the files of $hd whose names match the regex $1.
sizes() {
  find $hd -maxdepth 1 -type f -regextype posix-extended -regex ".*/$1" -printf '%s %b\n' |
    awk '{b += $1; n++; k += $2 / 2} END {printf "%d %d %d\n", b, n, k}'
}
report() {
  # A flush publishes every changed file (one fsync'd atomic write each). The load is paused
  # meanwhile (the sizes are then those of everything sampled up to the pause) and the flush
  # retried until one completes (dcpictl waits 20 s for one; at most 3 minutes), and timed.
  kill -STOP $load 2>/dev/null || true
  f0=$(date +%s)
  fl=incomplete; n=0
  while [ $n -lt 36 ]; do
    n=$((n+1))
    if "$dcpictl" --socket $t/s.sock flush > /dev/null 2>&1; then fl=ok; break; fi
    sleep 5
  done
  f1=$(date +%s)
  hd=$(ls -d $t/db/epochs/*/bench)
  who=$(stat -c %s $hd/who.tbl)
  set -- $(sizes '[^./]+\.[^./]+\.prof'); prof=$1 pfiles=$2 pkib=$3
  set -- $(sizes '[^/]+\.pid-[0-9]+\.prof'); pid=$1 pidfiles=$2 pidkib=$3
  set -- $(sizes '[^/]+\.cg-[0-9a-f]{16}\.prof'); cg=$1 cgfiles=$2 cgkib=$3
  pct() { awk "BEGIN {printf \"%.1f\", 100*$1/$2}"; }
  kill -CONT $load 2>/dev/null || true
  echo "load=$(( f0 - start - paused ))s $mode flush=$((f1 - f0))s($fl) by_pid=$by_pid by_cgroup=$by_cgroup who.tbl=$who B" \
    "profiles=$prof B ($pfiles files, $pkib KiB on disk) ratio=$(pct $who $prof)%" \
    "per-pid=$pid B ($pidfiles files, $pidkib KiB) = $(pct $pid $prof)% of profiles" \
    "per-cgroup=$cg B ($cgfiles files, $cgkib KiB) = $(pct $cg $prof)%"
  paused=$((paused + $(date +%s) - f0))
}
half=$((secs / 2))
sleep $half; report
sleep $((secs - half)); report
kill $load; wait $load 2>/dev/null || true
