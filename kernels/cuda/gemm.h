// Row-major GEMMs through cuBLASLt: y[M,N] = act(x[M,K] . w[N,K]^T + bias[N]).
// One cuBLASLt handle and one workspace per device, created on first use;
// matmul descriptors, layouts and the heuristic's algorithm list cached per
// (device, dtype, M, N, K, epilogue) so a call after the first builds nothing.
// Epilogues: bias and tanh-GELU run inside cuBLASLt while the accumulator is
// on chip (CUBLASLT_EPILOGUE_BIAS / GELU / GELU_BIAS). cuBLASLt has no SiLU
// and no erf-GELU epilogue: those run as one in-place elementwise pass after
// the GEMM (gemv.cu). Plain C++ header: no cuBLAS types leak out.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"
#include "kernels/op.h"

namespace fusedserve::cuda {

// y = act(x . w^T + bias): the linear problem every GEMM path takes.
struct GemmParams {
  DType dtype = DType::kBF16;  // x, w, bias and y share it; fp32 accumulation
  int64_t M = 0, N = 0, K = 0;
  const void* x = nullptr;     // [M,K], row stride K
  const void* w = nullptr;     // [N,K], row stride K
  const void* bias = nullptr;  // [N] or nullptr
  void* y = nullptr;           // [M,N], row stride N
  Activation act = Activation::kNone;
  // [M,N] or nullptr: y = x . w^T (+ bias) + residual, cuBLASLt's C with
  // beta = 1 (one rounding; no separate add pass). Activation kNone only.
  const void* residual = nullptr;
};

// Number of algorithms cuBLASLt's heuristic offers for this problem (at most
// kMaxGemmAlgos); 0 when it offers none (or there is no device). These are
// the linear op's tunable cuBLASLt candidates (linear.h: "p0.a0".."p0.a<n-1>").
constexpr int kMaxGemmAlgos = 8;
int GemmAlgoCount(DType dtype, int64_t M, int64_t N, int64_t K);

// Runs the GEMM with the heuristic's algo_index-th algorithm (clamped to the
// list; 0 = cuBLASLt's first choice). Errors name the failing cuBLASLt call;
// a shape cuBLASLt cannot run (no algorithm offered) is a clear error.
CudaStatus GemmForward(const GemmParams& args, int algo_index, cudaStream_t stream);

}  // namespace fusedserve::cuda
