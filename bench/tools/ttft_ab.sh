#!/usr/bin/env bash
# TTFT at concurrency 1 for PROMPT_LEN-token unique prompts, one server per
# flag set (each argument is one set, quoted), on the GPU host from a bundle.
# Usage: ttft_ab.sh BUNDLE PROMPT_LEN "FLAGS A" "FLAGS B" ...
b=$1 len=$2
shift 2
for flags in "$@"; do
  # shellcheck disable=SC2086
  "$b/env.sh" "$b/bin/fusedserve" --listen=127.0.0.1:50161 --metrics_listen=127.0.0.1:9192 --tuning_cache= \
      --tune_at_startup=false --model_preset=llama-3.2-1b $flags > /tmp/ttft-srv.log 2>&1 &
  srv=$!
  for i in $(seq 1 1200); do curl -s 127.0.0.1:9192/metrics | grep -q '^fusedserve_ready 1' && break; sleep 0.1; done
  echo "[$len $flags] $("$b/env.sh" "$b/bin/fusedserve_loadgen" --target=127.0.0.1:50161 --rpc=generate \
      --prompt_len=$len --max_new_tokens=1 --concurrency=1 --duration_s=3 --warmup_s=1 | grep 'first token')"
  kill -TERM $srv
  wait $srv
done
