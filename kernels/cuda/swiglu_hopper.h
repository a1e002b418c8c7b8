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

// Kernel variants. Measured on one H100 (gpu_gemm_matched_bench, M=4096
// D=4096 I=14336 bf16, 2 s of sustained launches first): group_m 8/16 1.54
// ms against 1.60 ms for one group; cluster 2 3.03 ms (tensor pipe 36%
// active), cause not found yet, so it stays off. On an H200, with the
// epilogue on one MUFU op and its stores under the next tile's wgmmas, the
// fused gate takes as long as cuBLASLt's gate_up GEMM alone (1.20-1.21 ms
// back to back; main's epilogue 1.27-1.28); cluster 2 still 2.18 ms with
// all 132 CTAs resident (66 clusters), so its loss is not the grid.
struct HopperSwigluOptions {
  // The persistent walk covers groups of group_m row tiles (128 rows, or a
  // cluster's 256), rows fastest inside a group; 0: all in one group.
  int group_m = 16;
  // 2: CTA pairs in a cluster share the weight tile through TMA multicast
  // (each weight byte read from L2 once per pair; correct, but slow, see
  // above); anything else: no clusters.
  int cluster = 1;
};

// Runs the fused gate; an unsupported call is a clear Unsupported error.
CudaStatus LaunchHopperSwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                              cudaStream_t stream, const HopperSwigluOptions& options = {});

}  // namespace fusedserve::cuda
