#!/usr/bin/env bash
# hf_compare.py on a GPU host with transformers but without the Python gRPC
# client's packages: BUNDLE is a bundle (README: GPU tests and benchmarks) of a CUDA build's fusedserve,
# WHEELS a folder of wheels for that host's python (grpcio and protobuf at
# least the versions clients/python's generated stubs name, typing-extensions;
# pytest and its deps if missing there), and the stubs in
# clients/python/fusedserve_client/_proto must travel along (they are
# generated, git-ignored). Head dim 64: the CUDA model runner's head dims are
# 16/32/64/128. The server runs the checkpoint on the CUDA runner, then the
# CPU runner. TP=N (default 1) splits the model over N GPUs (and N CPU
# ranks). Usage: run_hf_compare_gpu.sh BUNDLE WHEELS
set -euo pipefail
b=$(realpath "$1"); w=$2
cd "$(dirname "$0")/../.."
lib=/tmp/hf-pylib
python3 -m pip install -q --no-index --find-links "$w" --target "$lib" grpcio protobuf
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --no-index --find-links "$w" --target "$lib" pytest
source tests/gpu/nccl_env.sh  # the server's --tensor_parallel > 1
printf '#!/bin/bash\nexec %s/env.sh %s/bin/fusedserve "$@"\n' "$b" "$b" > /tmp/hf-fusedserve.sh
chmod +x /tmp/hf-fusedserve.sh
python3 tests/python/hf_compare.py make --out /tmp/hf --head-dim 64
for device in cuda cpu; do
  PYTHONPATH=$lib:clients/python python3 tests/python/hf_compare.py check --dir /tmp/hf --bin /tmp/hf-fusedserve.sh \
      --device $device --tensor-parallel "${TP:-1}"
done
