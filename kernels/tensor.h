// HostTensor: a dense row-major tensor in host memory, the unit every backend
// takes and returns. Bytes are kept as in the wire format (little-endian), so a
// request's payload can be moved in without a copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"

namespace fusedserve {

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string data;  // numel() * DTypeSize(dtype) bytes

  // Product of the extents (1 for rank 0). Shapes are validated before use,
  // so this never overflows on tensors that reach a backend.
  int64_t numel() const;
  int64_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
  int rank() const { return static_cast<int>(shape.size()); }

  // Float tensors converted to fp32 (exact for every float dtype).
  std::vector<float> ToFloat() const;
  // Integer tensors widened to int64.
  std::vector<int64_t> ToInt64() const;

  // Rounds fp32 values to dtype (round to nearest even).
  static HostTensor FromFloat(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values);
  static HostTensor FromInt64(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values);
};

}  // namespace fusedserve
