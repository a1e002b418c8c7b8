// Row softmax on the GPU over the last dim of a dense [rows, n] tensor, fp32
// statistics, any n. Plain C++ header: the kernels live in softmax.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

struct SoftmaxParams {
  DType dtype = DType::kBF16;
  const void* x = nullptr;  // [rows, n]
  void* y = nullptr;        // [rows, n]
  int64_t rows = 0;
  int64_t n = 0;
};

// Launch shape. A row is split over `cluster` blocks of one thread-block
// cluster (1, 2, 4 or 8; Hopper distributed shared memory combines their
// partial max/sum), each segment handled by `threads_per_row` threads (a power
// of two) that hold up to 8 vectors each in registers, so the row is read from
// HBM once; longer segments stream through twice. With cluster == 1,
// `rows_per_block` short rows can share a block. Format "t512.r1.c2".
struct SoftmaxConfig {
  int threads_per_row = 0;  // 0: not set (the launcher uses the default)
  int rows_per_block = 1;   // must be 1 when cluster > 1
  int cluster = 1;
};

std::string FormatSoftmaxConfig(const SoftmaxConfig& c);
bool ParseSoftmaxConfig(const std::string& s, SoftmaxConfig* c);
SoftmaxConfig DefaultSoftmaxConfig(DType dtype, int64_t rows, int64_t n);
// Candidates worth timing for a shape; the first is DefaultSoftmaxConfig.
std::vector<SoftmaxConfig> SoftmaxCandidates(DType dtype, int64_t rows, int64_t n);

// Runs one softmax on `stream` (an unfit or unset config is replaced by the
// default; the scalar path is used when n or a pointer is not 16-byte aligned).
CudaStatus LaunchSoftmax(const SoftmaxParams& p, const SoftmaxConfig& c, cudaStream_t stream);

}  // namespace fusedserve::cuda
