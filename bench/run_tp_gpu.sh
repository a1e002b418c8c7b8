#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU host, from a bundle (README: GPU tests and
# benchmarks; of nccl_group_test, model_cuda_test, gpu_collective_bench,
# gpu_model_bench, fusedserve, fusedserve_loadgen): the GPU links, the NCCL
# tests and the runner's sharded-vs-CPU test over every GPU, NCCL all-reduce
# latency per size at N = 2 and 4, the llama-3-8b decode and prefill steps at
# N = 1, 2, 4 (gpu_model_bench FS_BENCH=tp), then (WHEELS set) the
# transformers check at TP=2, and Generate through gRPC on the llama-3-8b
# preset at each N. Logs in OUT_DIR. Usage: run_tp_gpu.sh BUNDLE OUT_DIR
# (STEPS="tests collective model hf generate": a subset; GEN_SIZES="2 4":
# the N of the Generate runs).
set -u
b=$(realpath "$1")
out=$2
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/tests/gpu/nccl_env.sh"
# NVLink multicast (NVLS) stays off on shared hosts.
export NCCL_NVLS_ENABLE=0
steps=${STEPS:-tests collective model hf generate}
gpus=$(nvidia-smi -L | wc -l)
has() { [[ " $steps " == *" $1 "* ]]; }
nvidia-smi topo -m 2>&1 | head -12
if has tests; then
  timeout 240 "$b/env.sh" "$b/bin/nccl_group_test" > "$out/nccl_group_test.log" 2>&1; echo "nccl_group_test rc=$?"
  timeout 300 "$b/env.sh" "$b/bin/model_cuda_test" --gtest_filter='*TensorParallel*' --gtest_repeat=${REPEAT:-1} \
      > "$out/model_cuda_tp.log" 2>&1
  echo "model_cuda_test (TensorParallel) rc=$?"
  grep -hE "^\[  (PASSED|FAILED) |tensor parallel over|Failure" "$out"/nccl_group_test.log "$out"/model_cuda_tp.log |
    sort | uniq -c | head -20
fi
if has collective; then
  for n in 2 4; do
    [ "$n" -le "$gpus" ] || continue
    FS_TP_SIZE=$n timeout 120 "$b/env.sh" "$b/bin/gpu_collective_bench" 2>&1 | tee "$out/collective_$n.log"
  done
fi
if has model; then
  FS_BENCH=tp timeout 600 "$b/env.sh" "$b/bin/gpu_model_bench" 2>&1 | tee "$out/model_tp.log"
fi
if has hf && [ -n "${WHEELS:-}" ]; then
  TP=2 timeout 300 "$here/tests/python/run_hf_compare_gpu.sh" "$b" "$WHEELS" 2>&1 | tee "$out/hf_tp2.log" |
    grep -E "rel. error|greedy|tensor parallel|Error|error:" 
fi
if has generate; then
  for n in ${GEN_SIZES:-1 2 4}; do
    [ "$n" -le "$gpus" ] || continue
    "$b/env.sh" "$b/bin/fusedserve" --listen=127.0.0.1:50151 --metrics_listen=127.0.0.1:9191 --tuning_cache= \
        --tune_at_startup=false --model_preset=llama-3-8b --tensor_parallel=$n --max_running=64 \
        > "$out/server_tp$n.log" 2>&1 &
    srv=$!
    for i in $(seq 1 1800); do curl -s 127.0.0.1:9191/metrics | grep -q '^fusedserve_ready 1' && break; sleep 0.1; done
    for c in 1 16; do
      timeout 60 "$b/env.sh" "$b/bin/fusedserve_loadgen" --target=127.0.0.1:50151 --metrics=127.0.0.1:9191 \
          --rpc=generate --prompt_len=128 --max_new_tokens=128 --concurrency=$c --duration_s=6 --warmup_s=2 \
          --label="llama-3-8b tp=$n generate c=$c" 2>&1 | tail -4
    done
    kill $srv; wait $srv
  done
fi
