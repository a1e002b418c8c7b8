// GEMMs with a few token rows (kGemvMaxM < M <= kSkinnyMaxM: the decode step
// of 9 to 32 sequences) on tensor cores. Like the GEMV, they are bound by
// reading the weights once; cuBLASLt at these shapes starts too few CTAs
// (64 to 128 for a 2048-wide output) to keep HBM busy. Each warp streams a
// 16-row weight tile with 16-byte loads straight into mma.sync fragments
// (the K order within a 32-wide chunk is permuted alike in both operands,
// so no shared-memory staging), up to 8 warps split K and add up through
// shared memory. The SwiGLU form fuses gate, up and silu(g) * u.
// Plain C++ header; kernels in skinny_gemm.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

constexpr int64_t kSkinnyMaxM = 32;

// bf16/fp16, M <= kSkinnyMaxM, N (output features) a multiple of 16, K a
// multiple of 32, x and w 16-byte aligned.
bool SkinnyGemmSupported(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w);
// SkinnyGemmSupported's shape rules alone (pointers aside): where it is a tuning candidate.
bool SkinnyGemmShape(DType dtype, int64_t M, int64_t N, int64_t K);

// y = x . w^T.   x [M,K]; w [N,K]; y [M,N]
CudaStatus LaunchSkinnyGemm(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                            cudaStream_t stream);

// h = silu(x . gate^T) * (x . up^T) with gate_up = [gate; up].
//   x [M,D]; gate_up [2I,D]; h [M,I]   (SkinnyGemmSupported(dtype, M, I, D, ...))
CudaStatus LaunchSkinnySwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                              cudaStream_t stream);

}  // namespace fusedserve::cuda
