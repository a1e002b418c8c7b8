#!/usr/bin/env bash
# Builds the fusedserve container image from the Dockerfile with docker,
# podman or buildah, stamping the OCI labels (version, git revision, date).
#
# usage: build-image.sh [IMAGE[:TAG]] [extra build args...]
#   default image: fusedserve:<version from CMakeLists.txt>
# env:   CUDA_ARCHITECTURES (default 90), ENGINE (docker|podman|buildah),
#        DRY_RUN=1 prints the command instead of running it
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=$(sed -n 's/^project(fusedserve VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
image=${1:-fusedserve:${version}}
shift || true
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
source_url=$(git remote get-url origin 2>/dev/null || true)

engine=${ENGINE:-}
if [ -z "$engine" ]; then
  for e in docker podman buildah; do
    if command -v "$e" >/dev/null; then engine=$e; break; fi
  done
fi
if [ -z "$engine" ]; then
  if [ "${DRY_RUN:-0}" = 1 ]; then engine=docker; else
    echo "build-image: no container engine (docker, podman or buildah) found" >&2; exit 1
  fi
fi
case "$engine" in
  buildah) cmd=(buildah bud) ;;
  *) cmd=("$engine" build) ;;
esac
cmd+=(-f Dockerfile -t "$image"
  --build-arg "VERSION=$version"
  --build-arg "REVISION=$revision"
  --build-arg "CREATED=$created"
  --build-arg "SOURCE_URL=$source_url"
  --build-arg "CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-90}"
  "$@" .)

if [ "${DRY_RUN:-0}" = 1 ]; then
  printf '%q ' "${cmd[@]}"; echo
else
  "${cmd[@]}"
fi
