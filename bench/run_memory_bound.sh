#!/usr/bin/env bash
# Runs the generic GPU op test (every op), then the memory-bound benchmark,
# on a GPU host from a bundle (README: GPU tests and benchmarks):
#   bench/run_memory_bound.sh BUNDLE_DIR OUT_DIR [--quick] [--no-test]
# Writes OUT_DIR/test.log, bench.log, bench.json and gpu.txt (the card's
# clocks and temperature at the start); prints the test summary and the table.
set -uo pipefail
bundle=$1
out=$2
shift 2
run_test=1
bench_args=()
for a in "$@"; do
  if [ "$a" = "--no-test" ]; then run_test=0; else bench_args+=("$a"); fi
done
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv >"$out/gpu.txt" 2>&1 || true
cat "$out/gpu.txt"
status=0
if [ $run_test = 1 ]; then
  "$bundle/env.sh" "$bundle/bin/op_test" >"$out/test.log" 2>&1 || status=1
  grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED|checked|seed) ' "$out/test.log" | head -40
  grep -E 'Failure|Expected|Which is|error:' "$out/test.log" | head -30
fi
"$bundle/env.sh" "$bundle/bin/gpu_memory_bound_bench" "$out/bench.json" "${bench_args[@]}" \
  >"$out/bench.log" 2>&1 || status=1
grep -v '^|' "$out/bench.log" | head -20
grep '^|' "$out/bench.log"
exit $status
