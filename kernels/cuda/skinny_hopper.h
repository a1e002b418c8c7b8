// GEMMs of 33 to 64 token rows (decode steps of that many sequences) on
// Hopper's wgmma fed by TMA (kernels/cuda/sm90a/skinny_hopper.cu; compute
// capability 9.0 only, callers keep cuBLASLt as the fallback).
//
// Why a kernel of its own: at these shapes every GEMM streams its weights
// once and does little math per byte. The register-fed skinny GEMM
// (skinny_gemm.h) stops at 32 rows: above that its per-warp x fragments
// (4x a weight tile's bytes per chunk at 64 rows) swamp L1 and registers
// (measured: 0.4-0.5x cuBLASLt). cuBLASLt streams well (85-91% of copy
// bandwidth on the large ones) but launches without programmatic dependent
// launch, fills a wave only on the largest GEMMs, and leaves SwiGLU to a
// separate pass. Here the weights are wgmma's A operand (64 output features
// per consumer warpgroup) and x its B operand (the tokens, N = 64), both
// K-major in 128B-swizzled shared memory; a producer warp keeps kStages
// weight tiles in flight (the first ones issued before the PDL wait: they do
// not depend on the previous kernel), K is split over a thread-block
// cluster when the output alone would not fill the GPU, and the ranks' fp32
// partials are added through distributed shared memory in rank order
// (deterministic, no workspace). The SwiGLU form computes 64 gate and the
// matching 64 up features per CTA and writes silu(g) * u.
//
// It also takes the decode step's epilogues (LaunchSkinnyHopperFused): the
// fused layers of 33-64 row steps run every projection on it, and 9-32 row
// steps their down projection, where it keeps more weight tiles in flight
// than the register kernel's two- and four-tile forms (H200: the B=16 step
// -4%, B=24 -10%).
//
// Measured on the H100 (bench/notes/decode_fusion.md): at 64 rows 0.93-0.98x
// cuBLASLt on the large projections alone and 0.7-0.8x on the small ones; in
// the decode step it wins where it saves a kernel (the SwiGLU gate: no
// separate SiLU*mul; down: no split-K reduce), so the built-in rule takes it
// there only (skinny_gemm.h: SkinnyGemmByDefault), and it is a tuning
// candidate everywhere else from 5 rows up.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"  // GemvFusion
#include "kernels/dtype.h"

namespace fusedserve::cuda {

constexpr int64_t kSkinnyHopperMaxM = 64;

// The current device is compute capability 9.0 (and the TMA encoder exists).
bool SkinnyHopperAvailable();

// Whether the kernel's output tiles for N output features (SwiGLU: N = I)
// fit in one wave of the current device (one CTA an SM) before any K split.
bool SkinnyHopperOneWave(int64_t N, bool swiglu);

// bf16/fp16, 1 <= M <= kSkinnyHopperMaxM, K a multiple of 8 (TMA row
// strides), 16-byte aligned pointers (null pointers are accepted for
// shape-only queries), on a SkinnyHopperAvailable() device.
bool SkinnyHopperSupported(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w);

// y = x . w^T.   x [M,K]; w [N,K]; y [M,N]
CudaStatus LaunchSkinnyHopper(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                              cudaStream_t stream);

// y = x . w^T with gemv.h's decode epilogues except a folded norm_weight: a
// producer's residual add (with or without the next norm's norm_next,
// norm_out, sq_out, sq_clear; each warp adds its share of a row's sum of y^2
// as fixed point, so the sums are deterministic), a consumer's sq_in, and
// the rope + paged-cache epilogue (y unused; q/k head rows interleaved).
CudaStatus LaunchSkinnyHopperFused(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                                   const GemvFusion& f, cudaStream_t stream);

// h = silu(x . gate^T) * (x . up^T) with gate_up = [gate; up]; f: only a
// producer's sums (sq_in, eps), both products scaled by the rows' rstd.
//   x [M,D]; gate_up [2I,D]; h [M,I]   (SkinnyHopperSupported(dtype, M, I, D, ...))
CudaStatus LaunchSkinnyHopperSwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                    void* h, cudaStream_t stream, const GemvFusion& f = GemvFusion{});

}  // namespace fusedserve::cuda
