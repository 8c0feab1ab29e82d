#!/usr/bin/env bash
# Re-run the dcpi benchmarks: dcpid vs `perf record -a`, side by side.
#   bench/run.sh            full run (about 15 minutes on a 2-vCPU VM)
#   bench/run.sh --quick    smoke run (about 1-2 minutes)
# Other options are passed to bench/bench.py (see `python3 bench/bench.py --help`).
# Needs root (system-wide perf_event_open). Installs linux-perf if perf is missing, builds the
# release binaries, the workloads and the fleet generator, then runs bench/bench.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"

if [ "$(id -u)" != 0 ]; then
    echo "bench/run.sh: must run as root (system-wide profiling)" >&2
    exit 2
fi

if ! perf version >/dev/null 2>&1; then
    echo "bench: installing linux-perf" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null
fi
for tool in cc xz readelf python3; do
    command -v "$tool" >/dev/null || { echo "bench: $tool is required" >&2; exit 2; }
done

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
echo "bench: building release binaries (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)" >&2
cargo build --release --quiet -p dcpi-daemon -p dcpi-client
cargo build --release --quiet --manifest-path "$here/fleetgen/Cargo.toml"

wl="$here/workloads"
mkdir -p "$wl/bin"
for w in cpu mem churn; do
    cc -O2 -o "$wl/bin/$w" "$wl/$w.c"
done
# -fno-ipa-icf / -fno-inline: keep f1, f2, f3 distinct functions (ground truth by iterations).
cc -O2 -fno-ipa-icf -fno-inline -o "$wl/bin/mix" "$wl/mix.c"

exec python3 "$here/bench.py" \
    --bin-dir "$CARGO_TARGET_DIR/release" \
    --fleetgen "$CARGO_TARGET_DIR/release/dcpi-fleetgen" \
    --workload-dir "$wl/bin" "$@"
