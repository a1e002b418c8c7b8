// GEMMs with a few token rows (kGemvAutoMaxM < M <= kSkinnyMaxM: the decode
// step of 5 to 64 sequences) on tensor cores. Like the GEMV, they are bound
// by reading the weights once; cuBLASLt at these shapes starts too few CTAs
// (64 to 128 for a 2048-wide output) to keep HBM busy. Each warp streams a
// 16-row weight tile with 16-byte loads straight into mma.sync fragments
// (the K order within a 32-wide chunk is permuted alike in both operands,
// so no shared-memory staging), up to 8 warps split K and add up through
// shared memory. The SwiGLU form fuses gate, up and silu(g) * u. Above
// kSkinnyNarrowMaxM rows (or when asked) the Hopper kernel of
// skinny_hopper.h runs instead: this file's kernel re-reads x per warp,
// which costs more than the weights there.
// Plain C++ header; kernels in skinny_gemm.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

constexpr int64_t kSkinnyMaxM = 64;        // with the Hopper kernel (compute capability 9.0)
constexpr int64_t kSkinnyNarrowMaxM = 32;  // this file's kernel; the limit elsewhere

// bf16/fp16, M <= kSkinnyNarrowMaxM (kSkinnyMaxM on a Hopper device), N
// (output features) a multiple of 16, K a multiple of 32, x and w 16-byte
// aligned.
bool SkinnyGemmSupported(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w);
// SkinnyGemmSupported's shape rules alone (pointers aside): where it is a tuning candidate.
bool SkinnyGemmShape(DType dtype, int64_t M, int64_t N, int64_t K);
// Whether the built-in rule (no tuned config) takes the skinny GEMM at M
// rows, N output features and reduction length K (swiglu: the fused SwiGLU
// gate, N = I): always up to kSkinnyNarrowMaxM; above it, on Hopper, for a
// SwiGLU gate whose tiles fit in one wave (no separate SiLU*mul pass) and
// for few output features over a long K (N <= 2048, K >= 4096: the Hopper
// kernel's cluster split-K instead of cuBLASLt's split-K GEMM and reduce
// kernel); cuBLASLt for the rest. Measured on the H100 at B=64
// (bench/notes/decode_fusion.md): llama-3.2-1b's step 1.47-1.48 ms against
// 1.50-1.52 with cuBLASLt everywhere (its gate and down both take it; down
// alone lost) and 1.55 with the Hopper kernel everywhere; an 8B layer lost
// 4% with its down (N = 4096) on it, so the 8B shapes keep cuBLASLt.
// FUSEDSERVE_SKINNY_WIDE=0 / 1: cuBLASLt / the Hopper kernel for every
// projection above kSkinnyNarrowMaxM rows (A/B runs).
bool SkinnyGemmByDefault(int64_t M, int64_t N, int64_t K, bool swiglu);

// y = x . w^T.   x [M,K]; w [N,K]; y [M,N]. hopper: the Hopper kernel also
// at M <= kSkinnyNarrowMaxM (a tuning candidate) where it is available.
CudaStatus LaunchSkinnyGemm(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                            cudaStream_t stream, bool hopper = false);

// h = silu(x . gate^T) * (x . up^T) with gate_up = [gate; up].
//   x [M,D]; gate_up [2I,D]; h [M,I]   (SkinnyGemmSupported(dtype, M, I, D, ...))
CudaStatus LaunchSkinnySwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                              cudaStream_t stream);

// The decode step's fusions (gemv.h's GemvFusion: residual, norm_next /
// norm_out / sq_out / sq_clear, sq_in, rope_kv with head dims a multiple of
// 16; not a folded norm_weight): the same epilogues as the GEMV, so a step of
// 2 to 64 rows also drops the norm and rope kernels between projections.
// This file's kernel up to 8 rows; above, the Hopper skinny kernel
// (LaunchSkinnyHopperFused) where there is one, this file's kernel up to
// kSkinnyNarrowMaxM rows elsewhere (FUSEDSERVE_SKINNY_HOPPER_DOWN in
// skinny_gemm.cu chooses on Hopper).
CudaStatus LaunchSkinnyGemmFused(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                                 const GemvFusion& f, cudaStream_t stream);
// LaunchSkinnySwiglu with a producer's sums (f.sq_in, f.eps); f's other fields
// unset. Kernels as LaunchSkinnyGemmFused's.
CudaStatus LaunchSkinnySwigluFused(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                   void* h, const GemvFusion& f, cudaStream_t stream);

}  // namespace fusedserve::cuda
