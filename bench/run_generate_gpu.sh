#!/usr/bin/env bash
# Generation on a GPU host from a bundle (README: GPU tests and benchmarks; of fusedserve,
# fusedserve_loadgen, gpu_model_bench): decode-step times of the CUDA model
# runner, then Generate through gRPC with the llama-3.2-1b preset (random
# bf16 weights) at concurrency 1, 16 and 64 (unique prompts), then the TTFT
# of a long prompt with and without a cached prefix, and the engine's mean forward pass and host
# time between passes (fusedserve_engine_step_seconds). Usage: run_generate_gpu.sh BUNDLE
# (SKIP_MODEL_BENCH=1: the gRPC part only; SERVER=name: another server binary
# of the bundle, e.g. a base build for an A/B in the same lease;
# SERVER_FLAGS: extra server flags; SKIP_TTFT=1: no long-prompt TTFT runs)
b=$1
server=${SERVER:-fusedserve}
[ "${SKIP_MODEL_BENCH:-0}" = 1 ] || "$b/env.sh" "$b/bin/gpu_model_bench"
"$b/env.sh" "$b/bin/$server" --listen=127.0.0.1:50151 --metrics_listen=127.0.0.1:9191 --tuning_cache= \
    --tune_at_startup=false --model_preset=llama-3.2-1b --max_running=64 ${SERVER_FLAGS:-} > /tmp/srv.log 2>&1 &
srv=$!
for i in $(seq 1 1200); do curl -s 127.0.0.1:9191/metrics | grep -q '^fusedserve_ready 1' && break; sleep 0.1; done
grep -E "model|SERVING|kv" /tmp/srv.log | cut -c1-200
for c in 1 16 64; do
  "$b/env.sh" "$b/bin/fusedserve_loadgen" --target=127.0.0.1:50151 --metrics=127.0.0.1:9191 --rpc=generate \
      --prompt_len=128 --max_new_tokens=128 --concurrency=$c --duration_s=8 --warmup_s=2 --label="$server ${SERVER_FLAGS:-} generate c=$c"
done
# TTFT of unique 512- and 2048-token prompts (prefill), and of a 2048-token
# prompt whose first 2032 tokens were seen before (the prefix cache).
specs="512:0 2048:0 2048:2032"
[ "${SKIP_TTFT:-0}" = 1 ] && specs=""
for spec in $specs; do
  len=${spec%:*} shared=${spec#*:}
  "$b/env.sh" "$b/bin/fusedserve_loadgen" --target=127.0.0.1:50151 --metrics=127.0.0.1:9191 --rpc=generate \
      --prompt_len=$len --shared_prefix_len=$shared --max_new_tokens=1 --concurrency=1 --duration_s=4 --warmup_s=1 \
      --label="$server ttft prompt $len, shared $shared"
done
curl -s 127.0.0.1:9191/metrics | grep -E "^fusedserve_(prefix_cache_hit_tokens_total|prompt_tokens_total)"
curl -s 127.0.0.1:9191/metrics | grep -E "^fusedserve_(generated_tokens_total|time_per_output_token_seconds_(sum|count)|time_to_first_token_seconds_(sum|count))"
# Forward passes and the engine's host time between them, over the whole run (mean us).
curl -s 127.0.0.1:9191/metrics | awk -F'[ {}"=]+' '/^fusedserve_engine_step_seconds_(sum|count)/ {v[$1 " " $3] = $NF}
  END {for (p in v) if (p ~ /_sum/) {q = p; sub(/_sum/, "_count", q); split(p, a, " ");
       if (v[q] > 0) printf "engine %s: %d x %.1f us mean\n", a[2], v[q], 1e6 * v[p] / v[q]}}'
kill -TERM $srv; wait $srv; echo "server exit $?"
