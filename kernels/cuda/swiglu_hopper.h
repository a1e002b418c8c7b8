// The fused SwiGLU gate GEMM for Hopper (kernels/cuda/sm90a/gemm_hopper.cu):
// h[M,I] = silu(x . gate^T) * (x . up^T) with gate_up = [gate; up] [2I,D],
// in one kernel: each CTA computes a gate tile and the matching up tile as
// one wgmma m64n256 accumulator and writes only h, so the [M,2I]
// intermediate of the cuBLASLt path (written, then re-read by the SwiGLU
// pass) never reaches device memory. wgmma + TMA, sm_90a only: callers check
// HopperSwigluSupported and keep the cuBLASLt path as the fallback.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

// True when the current device is compute capability 9.0 and the call fits
// the kernel: bf16/fp16, D and I multiples of 8 (TMA's 16-byte row strides
// and the paired stores), 16-byte aligned pointers (null pointers are
// accepted for shape-only queries). Any M >= 1; tile tails are zero-filled by
// TMA and masked on store.
bool HopperSwigluSupported(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                           const void* h);

// Runs the fused gate; an unsupported call is a clear Unsupported error.
// group_m: the persistent walk covers groups of group_m 128-row tiles, rows
// fastest (0: all row tiles in one group).
CudaStatus LaunchHopperSwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                              cudaStream_t stream, int group_m = 0);

}  // namespace fusedserve::cuda
