// The compute launches for a tuning-cache value (the config string of an
// (op, dtype, TuningKey)), for callers that hold the strings: the model
// runner (model/cuda_runner.cc) looks its shapes up in the cache once and
// launches through these, so a shape tuned at start-up runs the same kernel
// as the op dispatch (linear_op.cc, swiglu_mlp_op.cc, attention_op.cc) runs
// for it. An empty or malformed string means the built-in rule.
// Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/linear.h"
#include "kernels/dtype.h"

namespace fusedserve {

// linear: y = act(x . w^T + bias).
inline CudaStatus LaunchLinearConfig(const cuda::GemmParams& g, const std::string& config, cudaStream_t stream) {
  cuda::LinearConfig c;
  cuda::ParseLinearConfig(config, &c);
  return cuda::LaunchLinear(g, c, stream);
}

// swiglu_mlp's gate (config: swiglu_mlp's; gate_up_config: linear's for {M, 2I, D}).
inline CudaStatus LaunchSwigluGate(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                   void* h, void* gu, const std::string& config, const std::string& gate_up_config,
                                   cudaStream_t stream) {
  cuda::SwigluMlpConfig c;
  cuda::ParseSwigluMlpConfig(config, &c);
  cuda::LinearConfig g;
  cuda::ParseLinearConfig(gate_up_config, &g);
  return cuda::LaunchSwigluGate(dtype, M, D, I, x, gate_up, h, gu, c, g, stream);
}
inline bool SwigluGateNeedsScratch(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                   const std::string& config) {
  cuda::SwigluMlpConfig c;
  cuda::ParseSwigluMlpConfig(config, &c);
  return cuda::SwigluGateNeedsScratch(dtype, M, D, I, x, gate_up, c);
}

// Flash prefill attention.
inline CudaStatus LaunchAttentionConfig(const cuda::AttentionParams& a, const std::string& config, int sm_count,
                                        cudaStream_t stream) {
  cuda::AttentionConfig c;
  if (!cuda::ParseAttentionConfig(config, &c)) c = cuda::DefaultAttentionConfig(a, sm_count);
  return cuda::LaunchAttentionPrefill(a, c, stream);
}

}  // namespace fusedserve
