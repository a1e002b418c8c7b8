#!/usr/bin/env bash
# The Hopper prefill attention's default config for several builds at ncu's
# locked base clocks (--clock-control base): the kernel's duration in ns for
# launches 4-8 of gpu_compute_bench's prefill row, sorted, one line per
# round, shape and build. At boost clock the same binary's rows moved by 10%
# between runs on an H200 lease; these move by about 1%.
# Each variant is "LABEL BUNDLE [VAR=VALUE ...]" (as in prefill_ab.sh).
# Usage: prefill_ncu_ab.sh ROUNDS SHAPES "head bundleA" "new bundleB" ...
#   e.g. prefill_ncu_ab.sh 2 4:2048,8:1024,4:2048:64 "head h" "new b"
set -u
rounds=$1 shapes=$2
shift 2
variants=("$@")
for r in $(seq 1 "$rounds"); do
  for s in ${shapes//,/ }; do
    for v in "${variants[@]}"; do
      read -r label b vars <<< "$v"
      printf '%-12s r%s B:S:D=%-10s ' "$label" "$r" "$s"
      # shellcheck disable=SC2086
      env FS_PREFILL_CONFIGS=none $vars timeout 120 ncu --clock-control base --kernel-name regex:HopperFlash \
        --launch-skip 3 --launch-count 5 --metrics gpu__time_duration.sum --csv \
        "$b/env.sh" "$b/bin/gpu_compute_bench" /tmp/prefill_ncu_ab.json "prefill:$s" 2>/dev/null |
        grep gpu__time_duration | awk -F'","' '{gsub(/"/,"",$NF); gsub(/,/,"",$NF); print $NF}' | sort -n | tr '\n' ' '
      echo
    done
  done
done
