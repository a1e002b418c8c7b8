// Greedy token choice on the device: the argmax of each row of the logits,
// so a decode step copies B token ids to the host instead of B x vocab
// logits (256 KB a row for a 128K vocabulary) and the host scans nothing.
// Plain C++ header; kernel in argmax.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

// Workspace bytes for `rows` rows. Zero it once when allocated: it holds
// counters that every launch leaves at zero.
size_t ArgmaxWorkspaceBytes(int64_t rows);

// out[r] = the lowest index i with logits[r, i] == max_j logits[r, j] (the
// CPU reference cpu::GreedyToken). NaN counts as lower than every number; an
// all-NaN row gives 0. A null workspace runs one CTA per row.
//   logits [rows, vocab] (float dtype); out [rows] int32
CudaStatus LaunchArgmaxRows(DType dtype, const void* logits, int64_t rows, int64_t vocab, int32_t* out, void* workspace,
                            cudaStream_t stream);

}  // namespace fusedserve::cuda
