#!/usr/bin/env bash
# c=1 FusedOp round trip of fusedserve against the bare echo (async, poll
# engine, pollers spinning 100 us: run_grpc_floor.sh's echo-async-spin100),
# both running at once and called by one client in alternating chunks
# (bench/grpc_floor/ab_client.cc), so that the host's drift from one
# stretch of time to the next hits both alike.
# Usage: run_grpc_ab.sh BINDIR [SECONDS] [RUNS] [fusedserve flags...]
#   BINDIR holds fusedserve, fusedserve_grpc_floor_server and
#   fusedserve_grpc_ab, or BINDIR/bench the last two (a build folder, e.g.
#   build), or a bundle's bin folder (its ../env.sh is then used).
#   CHUNK / SKIP (env): the client's --chunk / --skip.
set -uo pipefail
bin=$1
secs=${2:-10}
runs=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
env_sh=""
[ -x "$bin/../env.sh" ] && env_sh="$bin/../env.sh"
exe() { if [ -x "$bin/$1" ]; then echo "$bin/$1"; else echo "$bin/bench/$1"; fi; }
out=${OUT:-/tmp}/grpc_ab
mkdir -p "$out"
cores=$(nproc)
GRPC_POLL_STRATEGY=poll $env_sh "$(exe fusedserve_grpc_floor_server)" --model=async --threads="$cores" --spin_us=100 \
  --listen=127.0.0.1:50361 > "$out/echo.log" 2>&1 &
echo_pid=$!
$env_sh "$bin/fusedserve" --listen=127.0.0.1:50362 --metrics_listen=127.0.0.1:9262 --tuning_cache= \
  --tune_at_startup=false "$@" > "$out/fusedserve.log" 2>&1 &
fs_pid=$!
trap 'kill -TERM $echo_pid $fs_pid 2>/dev/null; wait 2>/dev/null' EXIT
for r in $(seq 1 "$runs"); do
  echo "run $r (fusedserve $*):"
  $env_sh "$(exe fusedserve_grpc_ab)" --a=127.0.0.1:50361 --b=127.0.0.1:50362 --label_a=echo-async-spin100 \
    --label_b=fusedserve --chunk="${CHUNK:-200}" --skip="${SKIP:-20}" --duration_s="$secs" || exit 1
  echo
done
