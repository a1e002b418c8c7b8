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
  t0=$(date +%s); el() { echo "[t+$(( $(date +%s) - t0 ))s]"; }
  timeout 60 "$bin/swiglu_hopper_test" > "$out/swiglu_hopper_test.log" 2>&1
  echo "swiglu_hopper_test rc=$? $(el)"; grep -cE "rel_err" "$out/swiglu_hopper_test.log"
  grep -E "Failure|FAIL|OK \]|PASSED" "$out/swiglu_hopper_test.log" | head -12
  timeout 70 "$bin/model_cuda_test" > "$out/model_cuda_test.log" 2>&1
  echo "model_cuda_test rc=$? $(el)"; grep -E "FAIL|PASSED|SKIPPED \]" "$out/model_cuda_test.log" | head -12
  v="gate_p0 gate_gemm gate_p3_c1_g8 gate_p3_c1_g16 gate_p3_c2_g4 gate_p3_c2_g8 gate_p3_c2_g16 gate_p3_c2_g0"
  echo "smi: $(smi)"
  timeout 40 "$bin/gpu_gemm_matched_bench" sustained $v > "$out/variants_sustained.txt" 2>&1
  echo "variants sustained rc=$? $(el)"; cut -c1-140 "$out/variants_sustained.txt"
  timeout 25 "$bin/gpu_gemm_matched_bench" burst $v > "$out/variants_burst.txt" 2>&1
  echo "variants burst rc=$? $(el)"; cut -c1-140 "$out/variants_burst.txt"
  echo "smi: $(smi)"
  timeout 100 python3 "$here/torch_matched_peer.py" "$bin/gpu_gemm_matched_bench" 1 > "$out/matched.txt" 2>&1
  echo "matched rc=$? $(el)"; grep -E "^\|" "$out/matched.txt"
  timeout 45 "$bin/gpu_compute_bench" "$out/compute_swiglu.json" swiglu > "$out/compute_swiglu.txt" 2>&1
  echo "compute swiglu rc=$? $(el)"; grep -hE "^\| (ceiling|swiglu)" "$out/compute_swiglu.txt" | cut -c1-200
  timeout 45 "$bin/gpu_compute_bench_base" "$out/compute_swiglu_base.json" swiglu > "$out/compute_swiglu_base.txt" 2>&1
  echo "compute swiglu base rc=$? $(el)"; grep -hE "^\| (ceiling|swiglu)" "$out/compute_swiglu_base.txt" | cut -c1-200
  for b in "" _base; do
    FS_BENCH=8b timeout 40 "$bin/gpu_model_bench$b" > "$out/model8b$b.txt" 2>&1
    echo "model 8b$b rc=$? $(el)"; grep -E "prefill B=2|decode B=1" "$out/model8b$b.txt"
  done
  timeout 40 "$bin/gpu_compute_bench" "$out/compute_linear.json" linear > "$out/compute_linear.txt" 2>&1
  echo "compute linear rc=$? $(el)"; grep -hE "^\| (ceiling|linear)" "$out/compute_linear.txt" | cut -c1-200
  timeout 30 ncu --clock-control none --kernel-name regex:SwigluGate --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum \
    "$bin/gpu_gemm_matched_bench" burst gate_p3 > "$out/ncu_gate.txt" 2>&1
  echo "ncu rc=$? $(el)"; grep -E "Duration|Throughput|SM Frequency|hmma|lts__t_bytes" "$out/ncu_gate.txt" | head -14
fi
