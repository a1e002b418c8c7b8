// HostTensor: a dense row-major tensor in host memory, the unit every backend
// takes and returns. Bytes are kept as in the wire format (little-endian), so a
// request's payload can be moved in without a copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"

namespace fusedserve {

// Host memory that a backend's kernels address in place (CUDA: pinned memory
// mapped into the device's address space). A FusedOp request's tensors are
// decoded straight into one, so no copy sits between the wire and the kernel,
// and the kernel writes its outputs after them. A block serves one request
// at a time: the tensors that point into it hold it (shared_ptr), and the
// pool that made it hands it out again once none does (Backend::TakeStaging).
struct StagingBlock {
  // Where each tensor starts in a block: aligned as the kernels' vector loads want.
  static constexpr size_t kAlign = 256;
  static size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  char* host = nullptr;
  char* device = nullptr;  // the same bytes as kernels address them
  size_t size = 0;
  size_t used = 0;              // bytes from `host` that the decoded inputs occupy
  bool outputs_placed = false;  // a launch has put its outputs after `used`
};

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // numel() * DTypeSize(dtype) bytes, in `data` or, when `view` is set, in
  // a staging block instead: read them through bytes().
  std::string data;
  const char* view = nullptr;  // into *block, view_size bytes
  size_t view_size = 0;
  std::shared_ptr<StagingBlock> block;  // keeps `view` alive

  std::string_view bytes() const {
    return view != nullptr ? std::string_view(view, view_size) : std::string_view(data);
  }
  size_t nbytes() const { return view != nullptr ? view_size : data.size(); }
  // The bytes are `n` at `p`, inside `b` (`data` is left as it is).
  void SetView(std::shared_ptr<StagingBlock> b, const char* p, size_t n) {
    view = p;
    view_size = n;
    block = std::move(b);
  }
  // No view: the bytes are `data`'s again, and the block is let go.
  void ClearView() { SetView(nullptr, nullptr, 0); }
  // The bytes in `data` (copied out of the staging block if they were there).
  void Own();

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
