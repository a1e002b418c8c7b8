#!/usr/bin/env bash
# Every GPU test binary of a bundle (README: GPU tests and benchmarks) on a
# GPU host: op_test in 8 parallel shards (it checks every op x dtype x case x
# candidate config), the others one after another. Prints each binary's
# summary line as it finishes (a run cut short by a time limit still shows
# what passed) and all of them again at the end; full logs in OUT_DIR. With
# fusedserve and fused_op_path_test in the bundle, also the server's
# concurrent-callers test against the CUDA backend.
# Usage: run_gpu_tests.sh BUNDLE OUT_DIR
set -u
b=$1
out=$2
mkdir -p "$out"
source "$b/env.sh"
source "$(dirname "$0")/nccl_env.sh"
: > "$out/rc.txt"
for i in 0 1 2 3 4 5 6 7; do
  (GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 300 stdbuf -oL "$b/bin/op_test" > "$out/op_test.$i.log" 2>&1
   echo "op_test shard $i rc=$?" >> "$out/rc.txt") &
done
wait
summary() {  # LABEL LOG RC: one line, also appended to rc.txt
  echo "$1 rc=$3 $(grep -E '^\[  (PASSED|FAILED) ' "$2" | tr '\n' ' ')" | tee -a "$out/rc.txt"
}
cat "$out/rc.txt"
grep -hE "^\[ checked" "$out"/op_test.*.log | awk '{s += $4} END {print "op_test: " s " (shape, config) runs checked"}'
echo "op_test: $(cat "$out"/op_test.*.log | grep -cE '^\[  FAILED  \]') FAILED lines"
for path in "$b"/bin/*_test; do
  t=$(basename "$path")
  case $t in op_test | fused_op_path_test) continue ;; esac
  timeout 300 "$b/bin/$t" > "$out/$t.log" 2>&1
  summary "$t" "$out/$t.log" $?
done
# On Hopper the fused projections of 9-32 row steps run the Hopper skinny
# kernel; the register kernels they use elsewhere, once more with them forced.
if [ -x "$b/bin/gemv_fused_test" ]; then
  FUSEDSERVE_SKINNY_HOPPER_DOWN=0 timeout 300 "$b/bin/gemv_fused_test" > "$out/gemv_fused_test.register.log" 2>&1
  summary "gemv_fused_test (register kernels)" "$out/gemv_fused_test.register.log" $?
fi
# The Hopper prefill attention's static tile order (its dynamic scheduler's
# way out), once more with it forced.
if [ -x "$b/bin/compute_test" ]; then
  FUSEDSERVE_ATTN_TILE_SCHED=0 timeout 300 "$b/bin/compute_test" --gtest_filter='*AttentionPrefillHopper*' \
    > "$out/compute_test.static_tiles.log" 2>&1
  summary "compute_test (Hopper attention, static tile order)" "$out/compute_test.static_tiles.log" $?
fi
# The backend's completion wait on cudaStreamQuery (the fallback where the
# stream cannot write the lane's completion word), once more with it forced.
if [ -x "$b/bin/cuda_backend_test" ]; then
  FUSEDSERVE_WAIT_FLAG=0 timeout 300 "$b/bin/cuda_backend_test" > "$out/cuda_backend_test.query.log" 2>&1
  summary "cuda_backend_test (stream-query wait)" "$out/cuda_backend_test.query.log" $?
fi
# The real server on the CUDA backend, many callers at once (small ops on its
# lanes, side by side; on one lane, merged by the batcher), when the bundle
# has the server and that test.
if [ -x "$b/bin/fusedserve" ] && [ -x "$b/bin/fused_op_path_test" ]; then
  FUSEDSERVE_BIN="$b/bin/fusedserve" FUSEDSERVE_TEST_SERVER_FLAGS=--device=cuda timeout 300 \
    "$b/bin/fused_op_path_test" --gtest_filter='*ConcurrentMixedOps*:*ConcurrentCallsStillBatch*' \
    > "$out/fused_op_path_test.cuda.log" 2>&1
  summary "fused_op_path_test (CUDA server, concurrent callers)" "$out/fused_op_path_test.cuda.log" $?
fi
echo "== all"
cat "$out/rc.txt"
for f in "$out"/*.log; do
  echo "== $(basename "$f"): $(grep -E '^\[  (PASSED|FAILED) ' "$f" | tr '\n' ' ') $(grep -cE '^\[  FAILED  \]' "$f") failed lines"
done
grep -hE "^\[ checked" "$out"/op_test.*.log | awk '{s += $4} END {print "op_test: " s " (shape, config) runs checked"}'
grep -hE "Failure|FAILED  \]" "$out"/*.log | sort | uniq -c | head -20
