#!/usr/bin/env bash
# Checks that deploy/install-runtime-deps.sh lists every distribution package
# whose shared library the fusedserve binary loads directly (ELF NEEDED), so
# the slim runtime image cannot miss a library. Libraries of the C/C++ runtime
# and of CUDA (in the nvidia/cuda runtime base image) are exempt. Runs in the
# Dockerfile's builder stage and in ctest (tests/deploy) on the built binary.
#
# usage: check-runtime-deps.sh PATH/TO/fusedserve
# exit:  0 ok, 1 a library's package is not listed, 77 cannot check here
set -euo pipefail
bin=${1:?usage: check-runtime-deps.sh PATH/TO/fusedserve}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

for tool in readelf ldd dpkg-query; do
  command -v "$tool" >/dev/null || { echo "check-runtime-deps: SKIP: $tool not found"; exit 77; }
done
if ! listed=$("$here/install-runtime-deps.sh" --print 2>&1); then
  echo "check-runtime-deps: SKIP: $listed"
  exit 77
fi

# Packages that the runtime base image provides.
exempt='^(libc6|libstdc\+\+6|libgcc-s1|libcublas.*|libcublaslt.*|cuda-.*|libnccl.*|libcudart.*)$'

# NEEDED sonames -> resolved paths (ldd) -> owning packages (dpkg).
mapfile -t needed < <(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
resolved=$(ldd "$bin")
status=0
declare -A seen=()
for soname in "${needed[@]}"; do
  # "libfoo.so.1 => /path (addr)", or "/lib64/ld-linux-x86-64.so.2 (addr)" for the loader
  path=$(awk -v s="$soname" '
    !found && $1 == s { print $3; found = 1 }
    !found && substr($1, length($1) - length(s)) == "/" s { print $1; found = 1 }' <<<"$resolved")
  if [ -z "$path" ] || [ "$path" = "not" ]; then
    echo "check-runtime-deps: $soname does not resolve on this machine"; status=1; continue
  fi
  real=$(readlink -f "$path")
  pkg=$(dpkg-query -S "$path" 2>/dev/null || dpkg-query -S "$real" 2>/dev/null || dpkg-query -S "${real#/usr}" 2>/dev/null || true)
  pkg=${pkg%%:*}
  if [ -z "$pkg" ]; then
    case "$real" in
      /usr/local/cuda*) continue ;;  # toolkit outside dpkg: base image
    esac
    echo "check-runtime-deps: $soname ($real) belongs to no package"; status=1; continue
  fi
  [ -n "${seen[$pkg]:-}" ] && continue
  seen[$pkg]=1
  if [[ "$pkg" =~ $exempt ]]; then
    echo "  $soname -> $pkg (base image)"
  elif grep -qxF "$pkg" <<<"$listed"; then
    echo "  $soname -> $pkg (listed)"
  else
    echo "check-runtime-deps: $soname comes from $pkg, which install-runtime-deps.sh does not list"; status=1
  fi
done
[ $status -eq 0 ] && echo "check-runtime-deps: every library of $bin is covered"
exit $status
