// Rotary position embedding on the GPU, LLaMA rotate-half layout (element i
// of a head rotates with element i + D/2), q and k in one launch, one
// position per token. Plain C++ header: the kernel lives in rope.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

struct RopeParams {
  DType dtype = DType::kBF16;
  const void* q = nullptr;             // [tokens, heads_q, head_dim]
  const void* k = nullptr;             // [tokens, heads_kv, head_dim]
  const int32_t* positions = nullptr;  // [tokens]
  void* q_out = nullptr;               // [tokens, heads_q, head_dim]
  void* k_out = nullptr;               // [tokens, heads_kv, head_dim]
  int64_t tokens = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;  // even
  double theta = 500000.0;
};

// Launch shape: a flat grid over (token, head, vector) units, each unit the
// pair of vectors x[i..i+kN) and x[i+D/2..i+D/2+kN) of one head; `threads`
// per block, each thread handling `unroll` units whose loads are all issued
// first. Format "t256.u2".
struct RopeConfig {
  int threads = 0;  // 0: not set (the launcher uses the default)
  int unroll = 1;   // 1, 2 or 4
};

std::string FormatRopeConfig(const RopeConfig& c);
bool ParseRopeConfig(const std::string& s, RopeConfig* c);
RopeConfig DefaultRopeConfig(DType dtype, int64_t tokens, int64_t heads_q, int64_t heads_kv, int64_t head_dim);
// Candidates worth timing for a shape; the first is DefaultRopeConfig.
std::vector<RopeConfig> RopeCandidates(DType dtype, int64_t tokens, int64_t heads_q, int64_t heads_kv,
                                       int64_t head_dim);

CudaStatus LaunchRope(const RopeParams& p, const RopeConfig& c, cudaStream_t stream);

}  // namespace fusedserve::cuda
