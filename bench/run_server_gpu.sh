#!/usr/bin/env bash
# End-to-end run of the real server on a GPU host, from a
# bundle (README: GPU tests and benchmarks; binaries: fusedserve, fusedserve_loadgen,
# cuda_backend_test, model_cuda_test). Usage: run_server_gpu.sh BUNDLE OUT_DIR
#  1. CUDA backend vs CPU backend for every op; CUDA model runner vs CPU runner
#  2. `fusedserve tune` cold (empty cache), then a warm restart: time to SERVING
#  3. loadgen: rms_norm M=1 H=4096 bf16 at concurrency 1, and at 64 with and
#     without the dynamic batcher (plus a CPU-backend server at concurrency 1
#     as a control for the gRPC path)
set -uo pipefail
b=$1; out=$2; mkdir -p "$out"
run() { "$b/env.sh" "$@"; }
port=50151; mport=9191
run "$b/bin/cuda_backend_test" 2>&1 | grep -E "OK|FAILED|PASSED|unsupported|rror" | tee "$out/tests.txt"
run "$b/bin/model_cuda_test" 2>&1 | grep -E "OK|FAILED|PASSED|rror" | tee -a "$out/tests.txt"
[ -x "$b/bin/gpu_backend_latency_bench" ] && run "$b/bin/gpu_backend_latency_bench" | tee "$out/backend_latency.txt"

cache=/tmp/fs-cache/tuning_cache.json; rm -rf /tmp/fs-cache; mkdir -p /tmp/fs-cache
t0=$(date +%s%N)
run "$b/bin/fusedserve" tune --tuning_cache=$cache > "$out/tune.log" 2>&1
echo "cold tune: $(( ($(date +%s%N) - t0) / 1000000 )) ms; $(tail -1 "$out/tune.log")" | tee "$out/warmup.txt"

serve() {  # serve NAME FLAGS...: start, wait for SERVING (metric), print start time
  local name=$1; shift
  local s=$(date +%s%N)
  "$b/env.sh" "$b/bin/fusedserve" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$mport --tuning_cache=$cache "$@" \
      > "$out/server-$name.log" 2>&1 &
  srv=$!
  for i in $(seq 1 600); do
    curl -s 127.0.0.1:$mport/metrics 2>/dev/null | grep -q '^fusedserve_ready 1' && break; sleep 0.1
  done
  echo "$name: SERVING after $(( ($(date +%s%N) - s) / 1000000 )) ms ($(grep -o 'SERVING.*' "$out/server-$name.log"))" | tee -a "$out/warmup.txt"
}
stop() { kill -TERM $srv; wait $srv; echo "exit code $? (0 = drained cleanly)" | tee -a "$out/warmup.txt"; }
lg() { run "$b/bin/fusedserve_loadgen" --target=127.0.0.1:$port --metrics=127.0.0.1:$mport \
          --op=rms_norm --dtype=bf16 --shape=1,4096 --duration_s=5 "$@"; }

serve cpu --device=cpu --batching=false
lg --concurrency=1 --label="c1 CPU backend (control: gRPC path without the GPU)" | tee "$out/loadgen.txt"
stop
serve batching --batching=true
lg --concurrency=1 --label="c1 batching on" | tee -a "$out/loadgen.txt"
lg --concurrency=64 --label="c64 batching on" | tee -a "$out/loadgen.txt"
stop
serve nobatch --batching=false
lg --concurrency=1 --label="c1 batching off" | tee -a "$out/loadgen.txt"
lg --concurrency=64 --label="c64 batching off" | tee -a "$out/loadgen.txt"
stop
