// The linear op's kernel choice (dispatch in linear_op.cc): cuBLASLt with one
// of its heuristic's algorithms, the bandwidth-bound GEMV for few rows
// (gemv.h), or the tensor-core skinny GEMM for a few more (skinny_gemm.h).
// Format "p0.a3" (kernels/cuda/config.h): p = path, a = the cuBLASLt
// algorithm index (0 on the other paths). The launches here are shared by the
// op dispatch and the model runner (through tuned_configs.h), so a tuned
// shape runs the same kernel whichever of the two calls it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

enum class LinearPath : int {
  kDefault = -1,  // not set: the built-in rule (LaunchLinear)
  kGemm = 0,      // cuBLASLt (gemm.h)
  kGemv = 1,      // gemv.h; falls back to the default where GEMV cannot run
  kSkinny = 2,    // skinny_gemm.h (no epilogue); likewise
  kHopper = 3,    // swiglu_mlp only: the fused wgmma gate GEMM (swiglu_hopper.h)
};

struct LinearConfig {
  LinearPath path = LinearPath::kDefault;
  int algo = 0;  // cuBLASLt heuristic algorithm (kGemm)
};

// The built-in rule's row limits: the GEMV (weight streaming on CUDA cores,
// launched as a programmatic dependent of the previous kernel) up to
// kGemvAutoMaxM rows, the tensor-core skinny GEMM up to cuda::kSkinnyNarrowMaxM
// (skinny_gemm.h) and on Hopper for some shapes up to kSkinnyMaxM
// (SkinnyGemmByDefault), cuBLASLt beyond. Measured on the H100: swiglu_mlp M=1
// D=4096 I=14336 129-131 us through the fused SwiGLU GEMV against 131-132 us
// for cuBLASLt's two GEMMs alone; at 2 rows and more the GEMV's FMA and x
// loads per weight byte made it issue-bound (1B decode step, same call:
// B=2 1.352-1.360 ms on the GEMV against 1.197-1.201 on the skinny GEMM, B=4
// 1.73-1.74 against 1.21; bench/notes/decode_fusion.md). Since the GEMV
// loads a chunk's x vectors at once and streams whole chunks without
// per-vector checks, two rows stream faster on it than on the skinny GEMM
// for every 1B shape (H200, M=2 with the residual + next-norm epilogue:
// down [2048, 8192] 10.4 us against 14.1, o_proj 4.4 / 4.5, QKV 5.7 / 5.8,
// gate_up 18.6 / 21.1; the 1B B=2 step 0.82 ms against 0.87;
// bench/gpu_gemv_stream_bench), four rows not (down 15.8 / 14.1). The tuner
// may pick any candidate that fits the shape.
constexpr int64_t kGemvAutoMaxM = 2;
// The built-in rule's GEMV: M <= kGemvAutoMaxM; with FUSEDSERVE_GEMV_MAX_M=n
// (0-8) in the environment, read once (A/B runs), M <= n instead.
bool GemvByDefault(int64_t M);

std::string FormatLinearConfig(const LinearConfig& c);
// False (and *c untouched) when `s` is not a well-formed linear config.
bool ParseLinearConfig(const std::string& s, LinearConfig* c);
// Candidates for y[M,N] = x[M,K] . w[N,K]^T: every cuBLASLt algorithm the
// heuristic offers (the first is the default, valid for every shape), then
// GEMV and the skinny GEMM where they can run. A new kernel for linear adds
// its path here.
std::vector<LinearConfig> LinearCandidates(DType dtype, int64_t M, int64_t N, int64_t K);
// y = act(x . w^T + bias) (+ residual) by the config; one that cannot apply
// to the call (GEMV for 64 rows, the skinny GEMM with a bias) takes the
// built-in rule. A residual always runs on cuBLASLt (GemmParams::residual).
CudaStatus LaunchLinear(const cuda::GemmParams& g, const LinearConfig& c, cudaStream_t stream);
// Whether LaunchLinear runs g (its residual aside) on cuBLASLt: where it
// does, a residual costs nothing more than the GEMM's extra read of it.
bool LinearRunsGemm(const cuda::GemmParams& g, const LinearConfig& c);

// swiglu_mlp's path for its gate h = silu(x . gate^T) * (x . up^T)
// (dispatch in swiglu_mlp_op.cc): "p0" a linear GEMM into gu = x . gate_up^T
// then the SwiGLU kernel, "p1" the fused SwiGLU GEMV, "p2" the fused skinny
// SwiGLU, "p3" the fused Hopper GEMM (compute capability 9.0 only; the gate
// and up tiles in one wgmma accumulator, only h written): a tuning candidate,
// not in the built-in rule, which keeps "p0" for many rows. Measured on the
// H100 at M=4096 D=4096 I=14336 its gate ties cuBLASLt + the SwiGLU pass
// (1.54 vs 1.51-1.53 ms sustained, 1.31 vs 1.36 ms in a burst); at M=256 the
// tuner picked it (165 vs 173 us for the MLP). The GEMMs (gate_up on p0, down always) run linear's tuned
// configs for their own shapes.
struct SwigluMlpConfig {
  LinearPath path = LinearPath::kDefault;  // kDefault: the built-in row rule
};
std::string FormatSwigluMlpConfig(const SwigluMlpConfig& c);
bool ParseSwigluMlpConfig(const std::string& s, SwigluMlpConfig* c);
// The first ("p0") fits every shape.
std::vector<SwigluMlpConfig> SwigluMlpCandidates(DType dtype, int64_t M, int64_t D, int64_t I);
// The gate (x [M,D], gate_up [2I,D] = [gate; up], h [M,I]) by the config;
// the GEMM path runs linear with gate_up_config into gu [M,2I], which may be
// null when SwigluGateNeedsScratch is false.
CudaStatus LaunchSwigluGate(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                            void* gu, const SwigluMlpConfig& c, const LinearConfig& gate_up_config,
                            cudaStream_t stream);
bool SwigluGateNeedsScratch(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                            const SwigluMlpConfig& c);

}  // namespace fusedserve::cuda
