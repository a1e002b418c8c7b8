#!/usr/bin/env bash
# Release build of the fusedserve binary alone (no tests, no benchmarks), with
# the CUDA backend: the Dockerfile's builder stage runs it; CI can run it on
# any machine with the CUDA toolkit.
#
# usage: build-release.sh [CUDA_ARCHITECTURES]   (default 90; e.g. "80;90")
# env:   FUSEDSERVE_CUDA=OFF for a CPU-only binary
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
archs=${1:-90}
cmake --preset default \
  -DFUSEDSERVE_CUDA="${FUSEDSERVE_CUDA:-ON}" \
  -DCMAKE_CUDA_ARCHITECTURES="$archs" \
  -DFUSEDSERVE_BUILD_TESTS=OFF -DFUSEDSERVE_BUILD_BENCH=OFF
cmake --build --preset default --target fusedserve
strip --strip-unneeded build/fusedserve
ls -l build/fusedserve
