// Row normalisations on the GPU: rms_norm, add_rms_norm (also writes the new
// residual x + residual), add_rms_norm_silu and layer_norm, over the last dim
// of a dense [rows, hidden] tensor, fp32 statistics. Plain C++ header: the
// kernels live in norm.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

enum class NormKind { kRms, kAddRms, kAddRmsSilu, kLayer };

// Runtime data of one call. All pointers are device pointers of `dtype`.
struct NormParams {
  NormKind kind = NormKind::kRms;
  DType dtype = DType::kBF16;
  const void* x = nullptr;         // [rows, hidden]
  const void* residual = nullptr;  // [rows, hidden]; add_* kinds only
  const void* weight = nullptr;    // [hidden]
  const void* bias = nullptr;      // [hidden]; layer_norm only
  void* y = nullptr;               // [rows, hidden]
  void* residual_out = nullptr;    // [rows, hidden]; add_rms_norm only (x + residual)
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-5f;
};

// Launch shape. A row is handled by `threads_per_row` threads (a power of two,
// 1..1024) that each hold up to 8 vectors of the row in registers (one HBM
// read); rows longer than that stream through twice. `rows_per_block` rows
// share a block (threads_per_row * rows_per_block <= 1024; <= 512 when a
// thread holds 8 vectors). Format "t256.r1".
struct NormConfig {
  int threads_per_row = 0;  // 0: not set (the launcher uses the default)
  int rows_per_block = 1;
};

std::string FormatNormConfig(const NormConfig& c);
// False (and *c untouched) when `s` is not a well-formed norm config.
bool ParseNormConfig(const std::string& s, NormConfig* c);
// The default for a shape: valid for every rows/hidden.
NormConfig DefaultNormConfig(DType dtype, int64_t rows, int64_t hidden);
// Candidates worth timing for a shape; the first is DefaultNormConfig.
std::vector<NormConfig> NormCandidates(DType dtype, int64_t rows, int64_t hidden);

// Runs one normalisation on `stream`. A config that does not fit the shape
// (or is unset) is replaced by the default; the 16-byte path is used when
// hidden and every pointer allow it, a scalar path otherwise.
CudaStatus LaunchNorm(const NormParams& p, const NormConfig& c, cudaStream_t stream);

}  // namespace fusedserve::cuda
