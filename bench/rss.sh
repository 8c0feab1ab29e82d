#!/bin/bash
# Peak RSS (VmHWM) of a 20 s dcpid run with a status request every 1.6 s (BENCHMARKS.md,
# "Does tokio earn its place?"). Run as root: bench/rss.sh path/to/dcpid
set -u
BIN=$1
D=$(mktemp -d /tmp/dcpi-rss.XXXXXX)
mkdir -p "$D/spool"
"$BIN" --config none --db "$D/db" --spool "$D/spool" --socket "$D/s" --duration 20s >"$D/log" 2>&1 &
P=$!
HWM=0
for i in $(seq 1 60); do
  sleep 0.4
  if [ -S "$D/s" ] && [ $((i % 4)) = 0 ]; then
    python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.sendall(b'{\"cmd\":\"status\"}\n'); s.recv(1 << 20)" "$D/s" 2>/dev/null
  fi
  v=$(awk '/VmHWM/{print $2}' /proc/$P/status 2>/dev/null)
  [ -n "$v" ] && HWM=$v
done
wait $P
rc=$?
echo "rc=$rc VmHWM=${HWM} KiB"
rm -rf "$D"
