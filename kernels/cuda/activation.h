// Elementwise activations on the GPU: silu_and_mul (SwiGLU, [rows, 2*cols]
// -> [rows, cols]) and gelu (erf or tanh form, any shape, flattened). Plain
// C++ header: the kernels live in activation.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

enum class ActKind { kSiluAndMul, kGeluErf, kGeluTanh };

struct ActParams {
  ActKind kind = ActKind::kGeluErf;
  DType dtype = DType::kBF16;
  const void* x = nullptr;  // silu_and_mul: [rows, 2*cols]; gelu: [rows, cols]
  void* y = nullptr;        // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
};

// Launch shape: `threads` per block, each thread handling `unroll` vectors
// (16 bytes, or single elements on the scalar path) whose loads are all
// issued before the first store. Format "t256.u4".
struct ActConfig {
  int threads = 0;  // 0: not set (the launcher uses the default)
  int unroll = 1;   // 1, 2 or 4
};

std::string FormatActConfig(const ActConfig& c);
bool ParseActConfig(const std::string& s, ActConfig* c);
ActConfig DefaultActConfig(ActKind kind, DType dtype, int64_t rows, int64_t cols);
// Candidates worth timing for a shape; the first is DefaultActConfig.
std::vector<ActConfig> ActCandidates(ActKind kind, DType dtype, int64_t rows, int64_t cols);

CudaStatus LaunchActivation(const ActParams& p, const ActConfig& c, cudaStream_t stream);

}  // namespace fusedserve::cuda
