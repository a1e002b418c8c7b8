#!/usr/bin/env bash
# Issue 13's GEMM part on one H100, from a bundle (bundle-libs.sh) holding
# swiglu_hopper_test, op_test, gpu_gemm_matched_bench, gpu_compute_bench(_base),
# gpu_model_bench(_base) and torch_matched_peer.py:
#   run_swiglu_gpu.sh validate   tests, SASS check, ncu of the fused gate,
#                                cuBLASLt candidates, tile-group variants,
#                                the matched torch comparison (2 rounds)
#   run_swiglu_gpu.sh final      the matched comparison (1 round), then
#                                gpu_compute_bench linear/swiglu and the 8B
#                                layer prefill, base (a79b71d) and new
# Logs under $OUT (or ./out); a short table last.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/bin"
out="${OUT:-./out}"
mkdir -p "$out"
smi() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader; }
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv | tee "$out/gpu.txt"
mode="${1:-validate}"
if [ "$mode" = validate ]; then
  echo "HGMMA in the fused gate: $(cuobjdump -sass "$bin/swiglu_hopper_test" 2>/dev/null | grep -c HGMMA)"
  timeout 90 "$bin/swiglu_hopper_test" > "$out/swiglu_hopper_test.log" 2>&1
  echo "swiglu_hopper_test rc=$?"; grep -E "rel_err|OK|FAIL|PASSED|SKIP" "$out/swiglu_hopper_test.log" | tail -40
  timeout 90 "$bin/op_test" --gtest_filter='*swiglu_mlp*' > "$out/op_test.log" 2>&1
  echo "op_test swiglu rc=$?"; grep -E "OK|FAIL|PASSED|SKIP" "$out/op_test.log" | tail -8
  timeout 60 ncu --clock-control none --kernel-name regex:SwigluGate --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    "$bin/gpu_gemm_matched_bench" burst gate_p3 > "$out/ncu_gate.txt" 2>&1
  echo "ncu rc=$?"; grep -E "Duration|Throughput|SM Frequency|Pipe|L2 Hit|DRAM" "$out/ncu_gate.txt" | head -24
  echo "smi: $(smi)"
  timeout 70 "$bin/gpu_gemm_matched_bench" algos > "$out/algos.txt" 2>&1
  echo "algos rc=$?"; grep -E "ALGOS|autotuner|  a0 " "$out/algos.txt"
  echo "smi: $(smi)"
  timeout 40 "$bin/gpu_gemm_matched_bench" sustained gate_p3_g2 gate_p3_g4 gate_p3_g8 gate_p3_g16 gate_p3 gate_p0 \
    > "$out/groups.txt" 2>&1
  echo "groups rc=$?"; cat "$out/groups.txt"
  echo "smi: $(smi)"
  timeout 170 python3 "$here/torch_matched_peer.py" "$bin/gpu_gemm_matched_bench" 2 > "$out/matched.txt" 2>&1
  echo "matched rc=$?"; grep -E "^\|" "$out/matched.txt"
else
  timeout 110 python3 "$here/torch_matched_peer.py" "$bin/gpu_gemm_matched_bench" 1 > "$out/matched.txt" 2>&1
  echo "matched rc=$?"
  for v in _base ""; do
    echo "smi: $(smi)"
    timeout 60 "$bin/gpu_compute_bench$v" "$out/compute$v.json" linear > "$out/compute_linear$v.txt" 2>&1
    timeout 60 "$bin/gpu_compute_bench$v" "$out/compute$v.json" swiglu > "$out/compute_swiglu$v.txt" 2>&1
    FS_BENCH=8b timeout 60 "$bin/gpu_model_bench$v" > "$out/model8b$v.txt" 2>&1
    FS_BENCH=8b FS_TUNE=1 FS_TUNE_CACHE=/tmp/fs_tune$v.json timeout 90 "$bin/gpu_model_bench$v" \
      > "$out/model8b_tuned$v.txt" 2>&1
  done
  for v in _base ""; do
    echo "== gpu_compute_bench$v"; grep -hE "^\| (ceiling|linear|swiglu)" "$out/compute_linear$v.txt" "$out/compute_swiglu$v.txt" | cut -c1-200
    echo "== gpu_model_bench$v 8b"; grep -E "prefill B=2|decode B=1" "$out/model8b$v.txt"
    echo "== gpu_model_bench$v 8b tuned"; grep -E "prefill B=2|decode B=1" "$out/model8b_tuned$v.txt"
  done
  grep -E "^\|" "$out/matched.txt"
fi
