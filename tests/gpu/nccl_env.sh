# Sourced by the GPU scripts: NCCL (tensor parallelism) is loaded at run time
# (dlopen of libnccl.so.2); where a host has it only in PyTorch's
# nvidia-nccl wheel, add that folder to LD_LIBRARY_PATH.
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2 && [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
  nccl=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null) &&
    export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl/lib
fi
