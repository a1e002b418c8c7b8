#!/usr/bin/env bash
# Per-kernel GPU time of the llama-3-8b decode step (B=1, context 2048) at
# each tensor-parallel size, from a bundle's gpu_model_bench (FS_BENCH=tp,
# FS_TP_DECODE_ONLY=1) under Nsight Systems (every graph node traced), or
# under bench/tools/cupti_trace.cc where nsys is missing (CUPTI=dir with
# libcupti_trace.so). Prints, per N, each kernel's share of the summed
# kernel time (all ranks) and its mean duration.
# Usage: profile_tp_decode.sh BUNDLE OUT_DIR [N...]
set -u
b=$(realpath "$1"); out=$2; shift 2
mkdir -p "$out"
here=$(cd "$(dirname "$0")/../.." && pwd)
source "$here/tests/gpu/nccl_env.sh"
export NCCL_NVLS_ENABLE=0 FS_BENCH=tp FS_TP_PLAIN=0 FS_TP_DECODE_ONLY=1
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1 2)
for n in "${sizes[@]}"; do
  if [ -n "$nsys" ]; then
    FS_TP_LIST=$n "$nsys" profile -q --trace=cuda --cuda-graph-trace=node -o "$out/tp$n" -f true \
        "$b/env.sh" "$b/bin/gpu_model_bench" | grep -E "^ +[0-9]"
    "$nsys" stats -q --report cuda_gpu_kern_sum --format csv -o "$out/tp$n" "$out/tp$n.nsys-rep" > /dev/null
    python3 - "$out/tp${n}_cuda_gpu_kern_sum.csv" "$n" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r['Total Time (ns)']) for r in rows)
print(f"N={sys.argv[2]}: {tot/1e6:.1f} ms of kernels")
for r in rows[:14]:
    t = float(r['Total Time (ns)'])
    print(f"  {100*t/tot:5.1f}%  mean {float(r['Avg (ns)'])/1e3:7.2f} us  x{r['Instances']:>7}  {r['Name'][:90]}")
PY
  else
    FS_TP_LIST=$n CUDA_INJECTION64_PATH=$CUPTI/libcupti_trace.so FS_TRACE_OUT=$out/tp$n.csv \
        "$b/env.sh" "$b/bin/gpu_model_bench" | grep -E "^ +[0-9]"
    python3 - "$out/tp$n.csv" "$n" <<'PY'
import collections, sys
agg = collections.defaultdict(lambda: [0, 0])
for line in open(sys.argv[1]):
    a = line.rstrip('\n').split(',', 4)
    agg[a[4][:90]][0] += int(a[1]) - int(a[0]); agg[a[4][:90]][1] += 1
tot = sum(v[0] for v in agg.values())
print(f"N={sys.argv[2]}: {tot/1e6:.1f} ms of kernels")
for k, (t, c) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:14]:
    print(f"  {100*t/tot:5.1f}%  mean {t/c/1e3:7.2f} us  x{c:>7}  {k}")
PY
  fi
done
