#!/usr/bin/env bash
# The 1B decode-step table of gpu_model_bench for several builds or settings,
# interleaved round by round so that every variant sees the same machine
# state (lease-to-lease differences are larger than most kernel changes).
# Each variant is "LABEL BUNDLE [VAR=VALUE ...]" (one quoted argument; the
# bundle's env.sh supplies the libraries). One line per variant and round:
# B/ctx step_ms (% of the weight + KV floor).
# Usage: decode_ab.sh ROUNDS BATCHES "base bundleA" "new bundleB" "new-noknob bundleB FUSEDSERVE_X=0" ...
#   e.g. decode_ab.sh 2 1,2,4,8,16 "start h" "final b"
set -u
rounds=$1 batches=$2
shift 2
variants=("$@")
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    read -r label b vars <<< "$v"
    printf '%-24s r%s  ' "$label" "$r"
    # shellcheck disable=SC2086
    env $vars FS_DECODE_BATCHES="$batches" FS_BENCH=decode timeout 120 "$b/env.sh" "$b/bin/gpu_model_bench" 2>&1 |
      grep -A16 step_ms | grep -E '^ +[0-9]+ ' | awk '{printf "%s/%s %s (%s)  ", $1, $2, $3, $5} END {print ""}'
  done
done
