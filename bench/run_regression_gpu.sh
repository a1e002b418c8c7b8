#!/usr/bin/env bash
# Before/after FusedOp latency and throughput on a GPU host, interleaved so
# that both builds see the same machine state: for each round, the base build
# (bin/fusedserve-base) then this build (bin/fusedserve) serve rms_norm bf16
# [1,4096] at concurrency 1 (sync client) and 64, batching on, with the same
# load generator. Then this build alone: a request over the cost bounds on the
# CUDA backend (RESOURCE_EXHAUSTED, server stays up) and `tune` refusing to
# run on the CPU backend.
# Usage: run_regression_gpu.sh BUNDLE [ROUNDS]   (a bundle, README: GPU tests and benchmarks, of fusedserve,
#        fusedserve-base, fusedserve_loadgen)
set -uo pipefail
b=$1
rounds=${2:-2}
port=50171; mport=9211
serve() {
  "$b/env.sh" "$b/bin/$1" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$mport --tuning_cache= \
      --tune_at_startup=false --batching=true > /tmp/reg-srv.log 2>&1 &
  srv=$!
  for i in $(seq 1 600); do curl -s 127.0.0.1:$mport/metrics | grep -q '^fusedserve_ready 1' && break; sleep 0.1; done
}
stop() { kill -TERM $srv; wait $srv; echo "exit code $?"; }
lg() { "$b/env.sh" "$b/bin/fusedserve_loadgen" --target=127.0.0.1:$port --metrics=127.0.0.1:$mport \
         --dtype=bf16 --duration_s=5 "$@" | grep -v "^server:"; }
for r in $(seq 1 "$rounds"); do
  for bin in fusedserve-base fusedserve; do
    serve $bin
    lg --op=rms_norm --shape=1,4096 --concurrency=1 --client_api=sync --label="round $r $bin c1 sync"
    lg --op=rms_norm --shape=1,4096 --concurrency=64 --label="round $r $bin c64"
    stop
  done
done
serve fusedserve
echo "== linear x [2^20,1] . w [2^20,1]^T (a 2 TiB output) on CUDA:"
lg --op=linear --shape=1048576,1048576,1 --concurrency=1 --requests=3 --check=false --distinct_inputs=1 --label="huge linear"
lg --op=rms_norm --shape=1,4096 --concurrency=1 --requests=200 --label="still serving"
stop
"$b/env.sh" "$b/bin/fusedserve" tune --device=cpu --tuning_cache= ; echo "tune on the CPU backend: exit code $?"
