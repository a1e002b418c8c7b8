// A stand-in for "the kernel before": the autotuner launches it right before
// each timed candidate, so a candidate's work ahead of its PDL wait (the L2
// prefetch of its weights, kernels/cuda/common.cuh) overlaps a running
// kernel as it does inside a model step, and the tuner ranks candidates by
// what they add to a stream of kernels, not by their cost alone.
// Plain C++ header; kernel in predecessor.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"

namespace fusedserve::cuda {

// Writes `bytes` (a multiple of 16) of buf: a bandwidth-bound kernel of a
// few microseconds for a few MB, launched with PDL like every kernel here.
CudaStatus LaunchPredecessor(void* buf, int64_t bytes, cudaStream_t stream);

}  // namespace fusedserve::cuda
