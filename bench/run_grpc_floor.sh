#!/usr/bin/env bash
# The gRPC floor of a FusedOp round trip beside fusedserve itself: the same
# load generator and message (rms_norm bf16 [1,4096]) against bare echo
# servers on each gRPC server model (bench/grpc_floor/echo_server.cc) and
# against fusedserve (and a base build's fusedserve, side by side), in
# interleaved rounds; prints the medians as a Markdown table.
#   c=1:  sync client, one stream: p50/p99 latency;
#   c=64: callback client, 8 connections: throughput, and the server's CPU
#         time per request (all its threads, from /proc/PID/stat, and by
#         thread name); then over one connection (CONN1=0 skips it);
#   c=MID (env MID=N): N sync clients on N connections, p50/p99 latency.
# Usage: [BASE=BASE_BINDIR] run_grpc_floor.sh BINDIR [ROUNDS] [SECONDS]
#   BINDIR holds fusedserve, fusedserve_loadgen, fusedserve_grpc_floor_server
#   (a build's bin folder, or a bundle-libs.sh bundle: then BINDIR/../env.sh
#   is used). BASE (env): the bin folder (or bundle bin) of the build to
#   compare with, e.g. main's; its fusedserve serves the fusedserve-base rows
#   (with BASE/../env.sh when present); without BASE, BINDIR/fusedserve-base
#   if present. Every row uses BINDIR's load generator (the same client).
#   SERVERS (env) picks the rows, e.g. SERVERS="echo-async fusedserve".
#   FS_FLAGS (env) adds flags to every fusedserve row. Rows: echo-{sync,
#   callback,async}[-health] (bare gRPC), echo-async-1cq (one queue, one
#   thread), echo-async-4 (four queues and threads), echo-async-sharedcq
#   (one queue polled by every thread), echo-async-spin (two threads that
#   never block), echo-async-spin{100,200} (poll engine, each thread polls
#   without blocking for 100 or 200 us after each event; fusedserve's default
#   is 100), echo-async-spin100-4 (at most four of them spin at once),
#   fusedserve-nospin, -spin50, -spin200 (--grpc_poll_spin_us=0, 50, 200),
#   fusedserve-spinall, -spinners{1,2,8} (--grpc_poll_spinners=0: every
#   polling thread may spin; 1, 2, 8; the default is 4), echo-{sync,async}-poll and fusedserve-poll (gRPC's poll() engine), fusedserve-4 (--grpc_pollers=4),
#   fusedserve (this build's defaults), fusedserve-cpu (--device=cpu: the
#   same host path, the op on the CPU backend), fusedserve-sharedcq (--grpc_cqs=1),
#   fusedserve-{callback,sync,async} (--fused_op_api), fusedserve-nozc (CUDA
#   without zero-copy), fusedserve-nobatch (--batching=false),
#   fusedserve-worker-answer (--fused_op_answer_on_poller=false),
#   fusedserve-protobuf (--fused_op_wire_codec=false),
#   fusedserve-lanes{1,2,4,8} (--cuda_small_op_lanes), fusedserve-noyield
#   (FUSEDSERVE_WAIT_YIELD=0: the completion wait never yields its core),
#   fusedserve-noflag (FUSEDSERVE_WAIT_FLAG=0: the wait polls cudaStreamQuery
#   instead of the lane's completion word), fusedserve-nostaged
#   (FUSEDSERVE_STAGED_DECODE=0: tensors decoded into their own buffers and
#   packed into the lane's staging memory, not into a pinned staging block),
#   fusedserve-prev (one lane, no yield: the defaults before both),
#   fusedserve-base[-inline|-nobatch] (the base build).
set -uo pipefail
bin=$1
rounds=${2:-3}
secs=${3:-3}
env_sh=""
[ -x "$bin/../env.sh" ] && env_sh="$bin/../env.sh"
base=${BASE:-}
base_env_sh=""
if [ -n "$base" ]; then
  [ -x "$base/../env.sh" ] && base_env_sh="$base/../env.sh"
  base_exe="$base/fusedserve"
else
  base_exe="$bin/fusedserve-base"
  base_env_sh=$env_sh
fi
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
cmd[echo-async-sharedcq]="fusedserve_grpc_floor_server --model=async --threads=$cores --cqs=1"
cmd[echo-async-spin]="fusedserve_grpc_floor_server --model=async --threads=2 --spin"
cmd[echo-async-spin200]="fusedserve_grpc_floor_server --model=async --threads=$cores --spin_us=200"
cmd[echo-async-spin100]="fusedserve_grpc_floor_server --model=async --threads=$cores --spin_us=100"
cmd[echo-async-spin100-4]="fusedserve_grpc_floor_server --model=async --threads=$cores --spin_us=100 --spinners=4"
cmd[echo-async-4]="fusedserve_grpc_floor_server --model=async --threads=4"
cmd[echo-async-poll]="fusedserve_grpc_floor_server --model=async --threads=$cores"
cmd[echo-sync-poll]="fusedserve_grpc_floor_server --model=sync"
cmd[echo-async-args]="fusedserve_grpc_floor_server --model=async --threads=$cores --minimal_stack --bdp_probe=0 --max_concurrent_streams=256"
fs="--listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$mport --tuning_cache= --tune_at_startup=false ${FS_FLAGS:-}"
cmd[fusedserve]="fusedserve $fs"
cmd[fusedserve-cpu]="fusedserve $fs --device=cpu"  # the same host path, the op on the CPU backend
cmd[fusedserve-sync]="fusedserve $fs --fused_op_api=sync"
cmd[fusedserve-async]="fusedserve $fs --fused_op_api=async"
cmd[fusedserve-callback]="fusedserve $fs --fused_op_api=callback"
cmd[fusedserve-nozc]="fusedserve $fs"  # CUDA: copies through device memory (no zero-copy)
cmd[fusedserve-sharedcq]="fusedserve $fs --grpc_cqs=1"
cmd[fusedserve-nobatch]="fusedserve $fs --batching=false"
cmd[fusedserve-worker-answer]="fusedserve $fs --fused_op_answer_on_poller=false"
cmd[fusedserve-protobuf]="fusedserve $fs --fused_op_wire_codec=false"
cmd[fusedserve-4]="fusedserve $fs --grpc_pollers=4"
cmd[fusedserve-nospin]="fusedserve $fs --grpc_poll_spin_us=0"
cmd[fusedserve-spinall]="fusedserve $fs --grpc_poll_spinners=0"
cmd[fusedserve-spinners1]="fusedserve $fs --grpc_poll_spinners=1"
cmd[fusedserve-spinners2]="fusedserve $fs --grpc_poll_spinners=2"
cmd[fusedserve-spinners8]="fusedserve $fs --grpc_poll_spinners=8"
cmd[fusedserve-spin50]="fusedserve $fs --grpc_poll_spin_us=50"
cmd[fusedserve-spin200]="fusedserve $fs --grpc_poll_spin_us=200"
cmd[fusedserve-lanes2]="fusedserve $fs --cuda_small_op_lanes=2"
cmd[fusedserve-lanes4]="fusedserve $fs --cuda_small_op_lanes=4"
cmd[fusedserve-lanes8]="fusedserve $fs --cuda_small_op_lanes=8"
cmd[fusedserve-lanes1]="fusedserve $fs --cuda_small_op_lanes=1"
cmd[fusedserve-noyield]="fusedserve $fs"
cmd[fusedserve-prev]="fusedserve $fs --cuda_small_op_lanes=1"
cmd[fusedserve-noflag]="fusedserve $fs"
cmd[fusedserve-nostaged]="fusedserve $fs"
cmd[fusedserve-poll]="fusedserve $fs"
cmd[fusedserve-poll-zc]="fusedserve $fs"
cmd[fusedserve-epoll1]="fusedserve $fs --grpc_poll_strategy=epoll1"
cmd[fusedserve-epoll1-zc64k]="fusedserve $fs --grpc_poll_strategy=epoll1"
declare -A envs
envs[fusedserve-nozc]="FUSEDSERVE_ZERO_COPY=0"
envs[fusedserve-noyield]="FUSEDSERVE_WAIT_YIELD=0"
envs[fusedserve-noflag]="FUSEDSERVE_WAIT_FLAG=0"  # the completion wait queries the stream instead
envs[fusedserve-nostaged]="FUSEDSERVE_STAGED_DECODE=0"  # tensors decoded into their own strings, packed per launch
envs[fusedserve-prev]="FUSEDSERVE_WAIT_YIELD=0"  # the defaults before lanes and the yielding wait
# gRPC's poll() engine: each queue's pollset polls only its own connections
# (epoll1, the default, has one epoll set that any polling thread may read).
envs[echo-async-poll]="GRPC_POLL_STRATEGY=poll"
envs[echo-async-spin200]="GRPC_POLL_STRATEGY=poll"  # fusedserve's engine and polling
envs[echo-async-spin100]="GRPC_POLL_STRATEGY=poll"
envs[echo-async-spin100-4]="GRPC_POLL_STRATEGY=poll"
envs[echo-sync-poll]="GRPC_POLL_STRATEGY=poll"
envs[fusedserve-poll]="GRPC_POLL_STRATEGY=poll"
envs[fusedserve-epoll1-zc64k]="FUSEDSERVE_ZERO_COPY_BYTES=65536"  # the defaults before the poll engine
envs[fusedserve-poll-zc]="GRPC_POLL_STRATEGY=poll FUSEDSERVE_ZERO_COPY_BYTES=1048576"
cmd[fusedserve-base]="$fs"
cmd[fusedserve-base-inline]="$fs --inline_max_bytes=262144"
cmd[fusedserve-base-nobatch]="$fs --batching=false"
servers=${SERVERS:-"echo-sync echo-sync-health echo-callback echo-async echo-async-health fusedserve-base fusedserve fusedserve-callback fusedserve-sync"}

# Started directly (env.sh execs), so that $! is the server itself: a server
# left running would share the port (gRPC sets SO_REUSEPORT) and answer the
# next row's calls. Each row also records who answered (GetServerInfo).
serve() {
  case $1 in
    fusedserve-base*)
      # shellcheck disable=SC2086
      env ${envs[$1]:-} $base_env_sh "$base_exe" ${cmd[$1]} --listen=127.0.0.1:$port > "$out/server-$1.log" 2>&1 &
      ;;
    *)
      # shellcheck disable=SC2086
      env ${envs[$1]:-} $env_sh "$bin/"${cmd[$1]} --listen=127.0.0.1:$port > "$out/server-$1.log" 2>&1 &
      ;;
  esac
  srv=$!
}
# CPU ticks (user + system) the server has used so far: the process's own
# line, which also counts threads that have exited (the sync API's pool).
# (The comm field has no spaces for these binaries, so $14/$15 are utime/stime.)
ticks() { awk '{print $14 + $15}' /proc/"$srv"/stat 2>/dev/null || echo 0; }
# Per thread: TID NAME TICKS (a name's spaces as _), to split the c=64 CPU
# time by thread name (fs-cq pollers, fs-batch workers, gRPC's own threads).
thread_ticks() {
  cat /proc/"$srv"/task/*/stat 2>/dev/null |
    awk '{ i = index($0, "("); j = index($0, ") "); name = substr($0, i + 1, j - i - 1); gsub(/ /, "_", name)
           split(substr($0, j + 2), f, " "); print $1, name, f[12] + f[13] }'
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
    case $s in fusedserve-base*) [ -x "$base_exe" ] || continue ;; esac
    serve "$s"
    lg "$out/$s-c1.txt" --concurrency=1 --client_api=sync
    case $s in fusedserve*) curl -s "127.0.0.1:$mport/metrics" > "$out/$s-c1-metrics.txt" ;; esac
    # The round's mean kernel stage at c=1 (launch to completion on CUDA, the
    # op itself on the CPU backend), for the ratio without it below.
    case $s in fusedserve*)
      awk '/^fusedserve_fused_op_stage_seconds_sum\{stage="kernel"\}/ {s = $2}
           /^fusedserve_fused_op_stage_seconds_count\{stage="kernel"\}/ {c = $2}
           END {printf "%.2f\n", (c > 0 ? s / c * 1e6 : 0)}' "$out/$s-c1-metrics.txt" >> "$out/$s-c1-kernel.txt" ;;
    esac
    # MID clients, each with its own connection and one call at a time: most
    # polling threads busy, none saturated.
    if [ -n "${MID:-}" ]; then
      thread_ticks > "$out/$s-mid-threads0.txt"
      lg "$out/$s-cmid.txt" --concurrency="$MID" --connections="$MID" --client_api=sync
      thread_ticks > "$out/$s-mid-threads1.txt"
      case $s in fusedserve*) curl -s "127.0.0.1:$mport/metrics" > "$out/$s-cmid-metrics.txt" ;; esac
    fi
    metrics=""
    case $s in fusedserve*) metrics="--metrics=127.0.0.1:$mport" ;; esac
    t0=$(ticks)
    thread_ticks > "$out/$s-threads0.txt"
    lg "$out/$s-c64.txt" --concurrency=64 $metrics
    t1=$(ticks)
    thread_ticks > "$out/$s-threads1.txt"
    # Server CPU us per request at c=64 (the run's ok requests; clock ticks of 1/CLK_TCK s).
    tail -1 "$out/$s-c64.txt" | awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '$1 > 0 {printf "%.1f\n", t / hz * 1e6 / $1}' >> "$out/$s-c64-cpu.txt"
    case $s in fusedserve*) curl -s "127.0.0.1:$mport/metrics" > "$out/$s-c64-metrics.txt" ;; esac
    # One connection (a client with one channel, as most are): gRPC reads a
    # connection on one thread at a time, so this tests how the server
    # spreads one connection's calls.
    [ "${CONN1:-1}" = 1 ] && lg "$out/$s-c64x1.txt" --concurrency=64 --connections=1
    stop
    echo "round $r $s: c1 $(tail -1 "$out/$s-c1.txt" | awk '{print $4" us p50"}'), c64 $(tail -1 "$out/$s-c64.txt" | awk '{print $3" req/s"}')" >&2
  done
done

median() { sort -g | awk '{v[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
col() { awk -v c="$2" '{print $c}' "$1" | median; }
echo "rms_norm bf16 [1,4096]; medians of $rounds interleaved rounds of $secs s; $(nproc) cores; $(uname -n)"
echo
echo "| server | answered by | c=1 p50 us | c=1 p99 us | c=1 p99/p50 | c=64 req/s | c=64 p50 us | c=64 p99 us | c=64 batch | c=64 server CPU us/req | c=64 one connection req/s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for s in $servers; do
  [ -s "$out/$s-c1.txt" ] || continue
  p50=$(col "$out/$s-c1.txt" 4)
  p99=$(col "$out/$s-c1.txt" 6)
  echo "| $s | $(sort -u "$out/$s-device.txt" | paste -sd/) | $p50 | $p99 | $(awk -v a="$p99" -v b="$p50" 'BEGIN{printf "%.2f", a/b}') |" \
    "$(col "$out/$s-c64.txt" 3) | $(col "$out/$s-c64.txt" 4) | $(col "$out/$s-c64.txt" 6) |" \
    "$( [ -s "$out/$s-c64-batch.txt" ] && col "$out/$s-c64-batch.txt" 1 || echo -) |" \
    "$( [ -s "$out/$s-c64-cpu.txt" ] && col "$out/$s-c64-cpu.txt" 1 || echo -) |" \
    "$( [ -s "$out/$s-c64x1.txt" ] && col "$out/$s-c64x1.txt" 3 || echo -) |"
done

if [ -n "${MID:-}" ]; then
  echo
  echo "| server | c=$MID p50 us | c=$MID p99 us | c=$MID req/s |"
  echo "|---|---|---|---|"
  for s in $servers; do
    [ -s "$out/$s-cmid.txt" ] && echo "| $s | $(col "$out/$s-cmid.txt" 4) | $(col "$out/$s-cmid.txt" 6) | $(col "$out/$s-cmid.txt" 3) |"
  done
fi

# Issue 18's ratios, paired by round (each fusedserve row against the best
# echo row of the same round, so that load drifting between rounds cancels):
# medians of c=1 p50 / the lowest echo p50 and c=64 req/s / the highest echo req/s.
echos=""
for s in $servers; do case $s in echo-*) [ -s "$out/$s-c1.txt" ] && echos="$echos $s" ;; esac; done
if [ -n "$echos" ]; then
  echo
  echo "| server | c=1 p50 / best echo's (same round) | c=1 p50 less its kernel stage / best echo's | c=64 req/s / best echo's (same round) |"
  echo "|---|---|---|---|"
  # Each round's best echo ("round value" lines): the lowest c=1 p50, the
  # highest c=64 throughput.
  # shellcheck disable=SC2086
  best_c1=$(for e in $echos; do awk '{print NR, $4}' "$out/$e-c1.txt"; done |
    awk '{ if (!($1 in b) || $2 < b[$1]) b[$1] = $2 } END { for (r in b) print r, b[r] }' | sort -n)
  # shellcheck disable=SC2086
  best_c64=$(for e in $echos; do awk '{print NR, $3}' "$out/$e-c64.txt"; done |
    awk '{ if (!($1 in b) || $2 > b[$1]) b[$1] = $2 } END { for (r in b) print r, b[r] }' | sort -n)
  for s in $servers; do
    case $s in fusedserve*) [ -s "$out/$s-c1.txt" ] || continue ;; *) continue ;; esac
    c1=$(paste -d' ' <(echo "$best_c1") <(awk '{print $4}' "$out/$s-c1.txt") |
      awk 'NF == 3 {printf "%.3f\n", $3 / $2}' | median)
    # The same pairing with the round's mean kernel stage taken off: what the
    # server's host path costs beyond the echo, without the op itself.
    c1_host=$(paste -d' ' <(echo "$best_c1") <(awk '{print $4}' "$out/$s-c1.txt") \
      <(cat "$out/$s-c1-kernel.txt" 2>/dev/null) | awk 'NF == 4 {printf "%.3f\n", ($3 - $4) / $2}' | median)
    c64=$(paste -d' ' <(echo "$best_c64") <(awk '{print $3}' "$out/$s-c64.txt") |
      awk 'NF == 3 {printf "%.3f\n", $3 / $2}' | median)
    echo "| $s | $c1 | $c1_host | $c64 |"
  done
fi

# Where a FusedOp spends its time (last round; fusedserve_fused_op_stage_seconds):
# at c=1, at c=MID when MID is set, and at c=64 (each the difference of its
# scrape and the one before).
stages() {
  awk '/^fusedserve_fused_op_stage_seconds_(sum|count)/ {
         match($0, /stage="[a-z0-9]+"/); st = substr($0, RSTART + 7, RLENGTH - 8)
         print st, ($1 ~ /_sum/ ? "sum" : "cnt"), $2 }
       /^fusedserve_request_duration_seconds_(sum|count)\{op="rms_norm"/ {
         print "request", ($1 ~ /_sum/ ? "sum" : "cnt"), $2 }' "$1"
}
for s in $servers; do
  scrapes=("$out/$s-c1-metrics.txt")
  header="c=1"
  if [ -s "$out/$s-cmid-metrics.txt" ]; then
    scrapes+=("$out/$s-cmid-metrics.txt")
    header="$header | c=$MID"
  fi
  scrapes+=("$out/$s-c64-metrics.txt")
  header="$header | c=64"
  grep -q fused_op_stage_seconds_sum "${scrapes[0]}" 2>/dev/null || continue
  echo
  echo "$s, mean per stage (us): $header"
  # Scrape k's lines as "k stage sum|cnt value"; each column is scrape k less k-1.
  for k in "${!scrapes[@]}"; do [ -s "${scrapes[$k]}" ] && stages "${scrapes[$k]}" | sed "s/^/$k /"; done |
    awk -v cols="${#scrapes[@]}" '{ v[$1, $2, $3] = $4 }
         END { n = split("receive decode queue h2d kernel d2h encode send request", order, " ")
               for (i = 1; i <= n; i++) {
                 st = order[i]
                 if (v[0, st, "cnt"] <= 0) continue
                 line = sprintf("  %-8s", st)
                 for (k = 0; k < cols; k++) {
                   c = v[k, st, "cnt"] - (k > 0 ? v[k - 1, st, "cnt"] : 0)
                   m = c > 0 ? sprintf("%8.2f", (v[k, st, "sum"] - (k > 0 ? v[k - 1, st, "sum"] : 0)) / c * 1e6) : "       -"
                   line = line (k > 0 ? " | " : " ") m
                 }
                 printf "%s%s\n", line, st == "request" ? "  (server time, send excluded)" : "" } }'
done

# Server CPU at c=64 by thread name (last round), us per request.
for s in $servers; do
  [ -s "$out/$s-threads1.txt" ] || continue
  n=$(tail -1 "$out/$s-c64.txt" | awk '{print $1}')
  echo
  echo "$s, c=64 server CPU by thread (us/request, last round):"
  awk -v n="$n" -v hz="$(getconf CLK_TCK)" 'FNR == NR { t0[$1] = $3; next }
       { d[$2] += $3 - ($1 in t0 ? t0[$1] : 0); k[$2]++ }
       END { for (x in d) if (d[x] > 0 && n > 0) printf "  %-16s %3d threads %8.1f\n", x, k[x], d[x] / hz * 1e6 / n }' \
    "$out/$s-threads0.txt" "$out/$s-threads1.txt" | sort -k4 -g -r
done

# How the c=MID load spreads over the server's threads (last round): each
# thread's busy share of the phase (warm-up included), highest first, by name.
# Connections land on completion queues unevenly (gRPC assigns each to a
# queue's poller at accept); two on one poller wait for each other.
for s in $servers; do
  [ -s "$out/$s-mid-threads1.txt" ] || continue
  echo
  echo "$s, c=$MID busy % per thread (last round, threads above 2%):"
  awk -v secs="$secs" -v warmup="${WARMUP:-1}" -v hz="$(getconf CLK_TCK)" \
    'FNR == NR { t0[$1] = $3; next }
     { p = ($3 - ($1 in t0 ? t0[$1] : 0)) / hz / (secs + warmup) * 100; if (p > 2) print $2, int(p + 0.5) }' \
    "$out/$s-mid-threads0.txt" "$out/$s-mid-threads1.txt" | sort -k1,1 -k2,2nr |
    awk '{ l[$1] = l[$1] " " $2 } END { for (n in l) printf "  %-16s%s\n", n, l[n] }'
done
