#!/usr/bin/env bash
# The Hopper prefill attention rows of gpu_compute_bench (Hq=32 Hkv=8,
# causal bf16; every built config) for several builds or settings,
# interleaved round by round like decode_ab.sh. Each variant is
# "LABEL BUNDLE [VAR=VALUE ...]" (one quoted argument). One line per round,
# shape and variant: the default's time, then each h128 config's, in us.
# SHAPES: B:S[:D] (D 64: the 1B preset's head dim; default 128).
# LOCKED=1 (env): instead, the default config's kernel at ncu's locked base
# clocks (--clock-control base): its duration in ns for launches 4-8, sorted.
# At boost clock one binary's rows moved by 10% between runs on an H200
# lease; these move by about 1%.
# Usage: [LOCKED=1] prefill_ab.sh ROUNDS SHAPES "base bundleA" "new bundleB" ...
#   e.g. prefill_ab.sh 2 4:2048,1:2048,4:2048:64 "head h" "new b"
set -u
rounds=$1 shapes=$2
shift 2
variants=("$@")
for r in $(seq 1 "$rounds"); do
  for s in ${shapes//,/ }; do
    for v in "${variants[@]}"; do
      read -r label b vars <<< "$v"
      printf '%-12s r%s B:S:D=%-10s ' "$label" "$r" "$s"
      if [ "${LOCKED:-0}" = 1 ]; then
        # shellcheck disable=SC2086
        env FS_PREFILL_CONFIGS=none $vars timeout 120 ncu --clock-control base --kernel-name regex:HopperFlash \
          --launch-skip 3 --launch-count 5 --metrics gpu__time_duration.sum --csv \
          "$b/env.sh" "$b/bin/gpu_compute_bench" /tmp/prefill_ab.json "prefill:$s" 2>/dev/null |
          grep gpu__time_duration | awk -F'","' '{gsub(/"/,"",$NF); gsub(/,/,"",$NF); print $NF}' | sort -n |
          tr '\n' ' '
      else
        # shellcheck disable=SC2086
        env $vars timeout 120 "$b/env.sh" "$b/bin/gpu_compute_bench" /tmp/prefill_ab.json "prefill:$s" 2>&1 |
          grep -E '^ *attn_prefill' | grep -E 'ours \((default|h128[^)]*)\)' |
          sed -E 's/.*ours \(([^)]*)\) +([0-9.]+) us.*/\1 \2/; s/^h128\.//' | tr '\n' ' '
      fi
      echo
    done
  done
done
