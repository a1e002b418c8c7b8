#!/usr/bin/env bash
# Installs the shared libraries the fusedserve binary needs at run time, and
# nothing else: the runtime stage of the Dockerfile uses it on
# nvidia/cuda:*-runtime-ubuntu24.04 (which already has the CUDA runtime and
# cuBLAS/cuBLASLt). Debian 12 is listed too, so that
# deploy/check-runtime-deps.sh can check the list against a real build on the
# CI machines. Transitive dependencies (re2, c-ares, zlib, civetweb)
# come with these packages.
#
# usage: install-runtime-deps.sh [--print]   --print: list the packages, install nothing
set -euo pipefail

. /etc/os-release
case "${ID}:${VERSION_ID}" in
  ubuntu:24.04)
    packages=(
      libgrpc++1.51t64 libgrpc29t64        # gRPC C++ (+ reflection) and core
      libprotobuf32t64                     # Protobuf 3.21
      libabsl20220623t64                   # Abseil
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0  # prometheus-cpp 1.0 (+ civetweb)
      libssl3t64                           # OpenSSL 3 libcrypto: TLS key/certificate checks
      libpcre2-8-0                         # PCRE2: the tokenizer's split pattern
      libicu74                             # ICU: the tokenizer's NFC/NFKC normalizers
    ) ;;
  debian:12)
    packages=(
      libgrpc++1.51 libgrpc29
      libprotobuf32
      libabsl20220623
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
      libssl3
      libpcre2-8-0
      libicu72
    ) ;;
  *)
    echo "install-runtime-deps: no package list for ${ID} ${VERSION_ID} (have ubuntu 24.04, debian 12)" >&2
    exit 2 ;;
esac

if [ "${1:-}" = "--print" ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}"
$SUDO rm -rf /var/lib/apt/lists/*
