// The compute ops' launches for a config string (the tuning cache's value
// for an (op, dtype, TuningKey)), shared by the op dispatch
// (dispatch_compute.cc) and the model runner (model/cuda_runner.cc), so a
// shape tuned at start-up runs the same kernel whichever of the two calls
// it. An empty config, or one that cannot apply to the call (GEMV for 64
// rows, the skinny GEMM with a bias), means the built-in rule. Configs:
//   linear      "algo=i" (cuBLASLt's i-th heuristic algorithm) | "gemv" | "skinny"
//   swiglu_mlp  "path=gemm" | "path=gemv" | "path=skinny" (how h = silu(x.gate^T) * (x.up^T) is made)
//   attention   "bm=128,w=4" | "bm=64,w=4" | "bm=128,w=8"
// Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/dtype.h"

namespace fusedserve {

// The built-in rule's row limits: the GEMV (weight streaming on CUDA cores,
// launched as a programmatic dependent of the previous kernel) up to
// kGemvAutoMaxM rows, the tensor-core skinny GEMM up to kSkinnyMaxM
// (skinny_gemm.h), cuBLASLt beyond. Measured on the H100: swiglu_mlp M=1
// D=4096 I=14336 129-131 us through the fused SwiGLU GEMV against 131-132 us
// for cuBLASLt's two GEMMs alone; above 4 rows the FMA work per weight byte
// grows and tensor cores take over. The tuner may pick any candidate that
// fits the shape.
constexpr int64_t kGemvAutoMaxM = 4;

// y = act(x . w^T + bias) (GemmArgs) by the linear config.
CudaStatus LaunchLinearConfig(const GemmArgs& g, const std::string& config, cudaStream_t stream);

// swiglu_mlp's first half, h = silu(x . gate^T) * (x . up^T) with gate_up =
// [gate; up] (x [M,D], gate_up [2I,D], h [M,I]), by the swiglu_mlp config:
// the GEMV and skinny paths fuse it in one pass over gate_up; the GEMM path
// runs linear (config gate_up_config, key {M, 2I, D}) into gu [M,2I], then
// the SwiGLU kernel. gu may be null when SwigluGateNeedsScratch is false.
CudaStatus LaunchSwigluGate(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                            void* gu, const std::string& config, const std::string& gate_up_config,
                            cudaStream_t stream);
bool SwigluGateNeedsScratch(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                            const std::string& config);

// Causal/non-causal prefill attention by the attention config.
CudaStatus LaunchAttentionConfig(const AttentionArgs& a, const std::string& config, int sm_count, cudaStream_t stream);

}  // namespace fusedserve
