// The linear op's kernel choice (dispatch in linear_op.cc): cuBLASLt with one
// of its heuristic's algorithms, or the bandwidth-bound GEMV for few rows
// (gemv.h). Format "p0.a3" (kernels/cuda/config.h): p = path, a = the
// cuBLASLt algorithm index (0 on the GEMV path).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace fusedserve::cuda {

enum class LinearPath : int {
  kDefault = -1,  // not set: GEMV up to kGemvAutoMaxM rows, else cuBLASLt algorithm 0
  kGemm = 0,      // cuBLASLt (gemm.h)
  kGemv = 1,      // gemv.h; falls back to the default where GEMV cannot run
};

struct LinearConfig {
  LinearPath path = LinearPath::kDefault;
  int algo = 0;  // cuBLASLt heuristic algorithm (kGemm)
};

// Up to this many rows the GEMV path is the default. Measured on the H100
// (bench/gpu_compute_bench.cc): swiglu_mlp M=1 D=4096 I=14336 129-131 us
// through the fused SwiGLU GEMV against 131-132 us for cuBLASLt's two GEMMs
// alone. Above M=4 the FMA work per weight byte grows and cuBLASLt's
// tensor-core kernels take over; the tuner may still pick GEMV up to M=8.
constexpr int64_t kGemvAutoMaxM = 4;

std::string FormatLinearConfig(const LinearConfig& c);
// False (and *c untouched) when `s` is not a well-formed linear config.
bool ParseLinearConfig(const std::string& s, LinearConfig* c);
// Candidates for y[M,N] = x[M,K] . w[N,K]^T: every cuBLASLt algorithm the
// heuristic offers (the first is the default, valid for every shape), then
// GEMV where it can run. A new kernel for linear adds its path here.
std::vector<LinearConfig> LinearCandidates(DType dtype, int64_t M, int64_t N, int64_t K);

// swiglu_mlp's path (dispatch in swiglu_mlp_op.cc): "p0" two cuBLASLt GEMMs
// around the SwiGLU kernel, "p1" the fused SwiGLU GEMV then a GEMV for down.
struct SwigluMlpConfig {
  LinearPath path = LinearPath::kDefault;  // kDefault: GEMV up to kGemvAutoMaxM rows
};
std::string FormatSwigluMlpConfig(const SwigluMlpConfig& c);
bool ParseSwigluMlpConfig(const std::string& s, SwigluMlpConfig* c);
// The first ("p0") fits every shape.
std::vector<SwigluMlpConfig> SwigluMlpCandidates(DType dtype, int64_t M, int64_t D, int64_t I);

}  // namespace fusedserve::cuda
