#!/usr/bin/env bash
# Fails when a C++/CUDA source differs from .clang-format's layout; prints
# the files and the command that fixes them.
set -euo pipefail
cd "$(dirname "$0")/../.."
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$fmt" ]; then
  echo "clang-format not installed (deploy/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null || find kernels warmup model engine server telemetry tests bench -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh')
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if ! "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'not clang-formatted: %s\n' "${bad[@]}" >&2
  echo "fix with: $fmt -i ${bad[*]}" >&2
  exit 1
fi
echo "clang-format: ${#files[@]} files clean"
