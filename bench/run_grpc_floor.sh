#!/usr/bin/env bash
# The gRPC floor of a FusedOp round trip beside fusedserve itself: the same
# load generator and message (rms_norm bf16 [1,4096]) against bare echo
# servers on each gRPC server model (bench/grpc_floor/echo_server.cc) and
# against fusedserve (and bin/fusedserve-base when present), in interleaved
# rounds; prints the medians as a Markdown table.
#   c=1:  sync client, one stream: p50/p99 latency;
#   c=64: callback client, 8 connections: throughput.
# Usage: run_grpc_floor.sh BINDIR [ROUNDS] [SECONDS]
#   BINDIR holds fusedserve, fusedserve_loadgen, fusedserve_grpc_floor_server
#   (a build's bin folder, or a bundle-libs.sh bundle: then BINDIR/../env.sh
#   is used). SERVERS (env) picks the rows, e.g. SERVERS="echo-async fusedserve".
#   FS_FLAGS (env) adds flags to every fusedserve row. Rows: echo-{sync,
#   callback,async}[-health] (bare gRPC), fusedserve (this build's defaults),
#   fusedserve-{callback,sync,async} (--fused_op_api), fusedserve-nozc (CUDA
#   without zero-copy), fusedserve-base[-inline] (BINDIR/fusedserve-base).
set -uo pipefail
bin=$1
rounds=${2:-3}
secs=${3:-3}
env_sh=""
[ -x "$bin/../env.sh" ] && env_sh="$bin/../env.sh"
port=50351
mport=9251
cores=$(nproc)
out=${OUT:-/tmp}/grpc_floor
mkdir -p "$out"
rm -f "$out"/*.txt "$out"/*.log

# name -> command line
declare -A cmd
cmd[echo-sync]="fusedserve_grpc_floor_server --model=sync"
cmd[echo-callback]="fusedserve_grpc_floor_server --model=callback"
cmd[echo-async]="fusedserve_grpc_floor_server --model=async --threads=$cores"
cmd[echo-sync-health]="fusedserve_grpc_floor_server --model=sync --health"
cmd[echo-async-health]="fusedserve_grpc_floor_server --model=async --threads=$cores --health"
cmd[echo-async-1cq]="fusedserve_grpc_floor_server --model=async --threads=1"
cmd[echo-async-spin]="fusedserve_grpc_floor_server --model=async --threads=2 --spin"
cmd[echo-async-args]="fusedserve_grpc_floor_server --model=async --threads=$cores --minimal_stack --bdp_probe=0 --max_concurrent_streams=256"
fs="--listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$mport --tuning_cache= --tune_at_startup=false ${FS_FLAGS:-}"
cmd[fusedserve]="fusedserve $fs"
cmd[fusedserve-sync]="fusedserve $fs --fused_op_api=sync"
cmd[fusedserve-async]="fusedserve $fs --fused_op_api=async"
cmd[fusedserve-callback]="fusedserve $fs --fused_op_api=callback"
cmd[fusedserve-nozc]="fusedserve $fs"  # CUDA: copies through device memory (no zero-copy)
declare -A envs
envs[fusedserve-nozc]="FUSEDSERVE_ZERO_COPY=0"
cmd[fusedserve-base]="fusedserve-base $fs"
cmd[fusedserve-base-inline]="fusedserve-base $fs --inline_max_bytes=262144"
servers=${SERVERS:-"echo-sync echo-sync-health echo-callback echo-async echo-async-health fusedserve-base fusedserve fusedserve-callback fusedserve-sync"}

# Started directly (env.sh execs), so that $! is the server itself: a server
# left running would share the port (gRPC sets SO_REUSEPORT) and answer the
# next row's calls. Each row also records who answered (GetServerInfo).
serve() {
  # shellcheck disable=SC2086
  env ${envs[$1]:-} $env_sh "$bin/"${cmd[$1]} --listen=127.0.0.1:$port > "$out/server-$1.log" 2>&1 &
  srv=$!
}
stop() {
  kill -TERM "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
}
# The numeric row of the load generator's table (ok errors req/s p50 p90 p99
# max mean) into $1; the "server:" line into $out/$s-device.txt.
lg() {
  local f=$1
  shift
  $env_sh "$bin/fusedserve_loadgen" --target=127.0.0.1:$port --op=rms_norm --dtype=bf16 --shape=1,4096 \
    --duration_s="$secs" --warmup_s="${WARMUP:-1}" --check=false "$@" > "$out/lg.txt" 2>&1
  awk '$1 ~ /^[0-9]+$/ && NF >= 8 {print $1, $2, $3, $4, $5, $6, $7, $8}' "$out/lg.txt" >> "$f"
  # With --metrics the row has a ninth column: the mean batch size.
  awk '$1 ~ /^[0-9]+$/ && NF == 9 {print $9}' "$out/lg.txt" >> "${f%.txt}-batch.txt"
  grep -m1 '^server:' "$out/lg.txt" | sed 's/^server: *//' >> "$out/$s-device.txt"
}

for r in $(seq 1 "$rounds"); do
  for s in $servers; do
    case $s in fusedserve-base*) [ -x "$bin/fusedserve-base" ] || continue ;; esac
    serve "$s"
    lg "$out/$s-c1.txt" --concurrency=1 --client_api=sync
    case $s in fusedserve*) curl -s "127.0.0.1:$mport/metrics" > "$out/$s-c1-metrics.txt" ;; esac
    metrics=""
    case $s in fusedserve*) metrics="--metrics=127.0.0.1:$mport" ;; esac
    lg "$out/$s-c64.txt" --concurrency=64 $metrics
    stop
    echo "round $r $s: c1 $(tail -1 "$out/$s-c1.txt" | awk '{print $4" us p50"}'), c64 $(tail -1 "$out/$s-c64.txt" | awk '{print $3" req/s"}')" >&2
  done
done

median() { sort -g | awk '{v[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
col() { awk -v c="$2" '{print $c}' "$1" | median; }
echo "rms_norm bf16 [1,4096]; medians of $rounds interleaved rounds of $secs s; $(nproc) cores; $(uname -n)"
echo
echo "| server | answered by | c=1 p50 us | c=1 p99 us | c=1 p99/p50 | c=64 req/s | c=64 p50 us | c=64 p99 us | c=64 batch |"
echo "|---|---|---|---|---|---|---|---|---|"
for s in $servers; do
  [ -s "$out/$s-c1.txt" ] || continue
  p50=$(col "$out/$s-c1.txt" 4)
  p99=$(col "$out/$s-c1.txt" 6)
  echo "| $s | $(sort -u "$out/$s-device.txt" | paste -sd/) | $p50 | $p99 | $(awk -v a="$p99" -v b="$p50" 'BEGIN{printf "%.2f", a/b}') |" \
    "$(col "$out/$s-c64.txt" 3) | $(col "$out/$s-c64.txt" 4) | $(col "$out/$s-c64.txt" 6) |" \
    "$( [ -s "$out/$s-c64-batch.txt" ] && col "$out/$s-c64-batch.txt" 1 || echo -) |"
done

# Where a c=1 FusedOp spends its time (last round; fusedserve_fused_op_stage_seconds).
for s in $servers; do
  m="$out/$s-c1-metrics.txt"
  grep -q fused_op_stage_seconds_sum "$m" 2>/dev/null || continue
  echo
  echo "$s at c=1, mean per stage (us):"
  awk '/^fusedserve_fused_op_stage_seconds_(sum|count)/ {
         match($0, /stage="[a-z0-9]+"/); st = substr($0, RSTART + 7, RLENGTH - 8)
         if ($1 ~ /_sum/) sum[st] = $2; else cnt[st] = $2 }
       /^fusedserve_request_duration_seconds_(sum|count)\{op="rms_norm"/ {
         if ($1 ~ /_sum/) rs = $2; else rc = $2 }
       END { n = split("receive decode queue h2d kernel d2h encode send", order, " ")
             for (i = 1; i <= n; i++) if (cnt[order[i]] > 0) printf "  %-8s %8.2f\n", order[i], sum[order[i]] / cnt[order[i]] * 1e6
             if (rc > 0) printf "  %-8s %8.2f (server time, send excluded)\n", "request", rs / rc * 1e6 }' "$m"
done
