#!/usr/bin/env bash
# FusedOp round-trip latency on a GPU host, from a bundle (README: GPU tests and benchmarks; of
# fusedserve, fusedserve_loadgen, fusedserve_wakeup_bench):
#   1. the host's floor without gRPC (thread wake-ups, TCP loopback);
#   2. rms_norm bf16 [1,4096] at concurrency 1: callback vs sync client, with
#      and without --inline_max_bytes (small ops on the gRPC thread);
#   3. concurrency 64 with and without the dynamic batcher.
# Usage: run_latency_gpu.sh BUNDLE
set -uo pipefail
b=$1
port=50161; mport=9201
"$b/env.sh" "$b/bin/fusedserve_wakeup_bench"
serve() {
  "$b/env.sh" "$b/bin/fusedserve" --listen=127.0.0.1:$port --metrics_listen=127.0.0.1:$mport --tuning_cache= \
      --tune_at_startup=false "$@" > /tmp/lat-srv.log 2>&1 &
  srv=$!
  for i in $(seq 1 600); do curl -s 127.0.0.1:$mport/metrics | grep -q '^fusedserve_ready 1' && break; sleep 0.1; done
}
stop() { kill -TERM $srv; wait $srv; }
lg() { "$b/env.sh" "$b/bin/fusedserve_loadgen" --target=127.0.0.1:$port --metrics=127.0.0.1:$mport \
         --op=rms_norm --dtype=bf16 --shape=1,4096 --duration_s=5 "$@" | grep -v "^server:"; }
serve --batching=true
lg --concurrency=1 --label="c1 batching on, callback client"
lg --concurrency=1 --client_api=sync --label="c1 batching on, sync client"
lg --concurrency=64 --label="c64 batching on"
stop
serve --batching=false
lg --concurrency=1 --client_api=sync --label="c1 batching off, sync client"
lg --concurrency=64 --label="c64 batching off"
stop
serve --batching=true --inline_max_bytes=262144
lg --concurrency=1 --client_api=sync --label="c1 batching on, inline, sync client"
lg --concurrency=64 --label="c64 batching on, inline"
stop
