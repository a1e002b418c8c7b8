// The seam between the CUDA backend (buffers, transfers, locking) and the op
// families (which launcher to call with which config). Plain C++: dispatch
// files are compiled by the host compiler and call launchers from the family
// headers (norm.h, softmax.h, ...), whose kernels live in .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/op.h"

namespace fusedserve {

// A tensor in device memory. Index inputs (positions, seq_lens, lengths) are
// always I32 on the device: the backend narrows them after validation.
struct DeviceTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};
using DeviceTensorMap = std::map<std::string, DeviceTensor>;

// Input `name` of a request as it lives on the device (data not set):
// index inputs as I32, every other input in its own dtype.
DeviceTensor DeviceInput(const OpRequest& r, const std::string& name);
// Writes input `name`'s values in that device dtype to host memory `dst`
// (numel x dtype size bytes), narrowing index values to int32.
void WriteDeviceInput(const OpRequest& r, const std::string& name, void* dst);

// Device scratch memory valid for the duration of one op (grown on demand,
// reused across requests).
class Scratch {
 public:
  virtual ~Scratch() = default;
  virtual CudaStatus Get(size_t bytes, void** ptr) = 0;
};

struct DispatchContext {
  cudaStream_t stream = nullptr;
  int sm_count = 0;
  ConfigLookup config;  // may be empty: defaults (see kernels/op.h)
  Scratch* scratch = nullptr;
};

// Each op family's dispatcher. *handled is false when the op is not one of
// that family's (the backend then tries the next dispatcher).
CudaStatus RunMemoryBoundOp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                            DispatchContext& ctx, bool* handled);
CudaStatus RunComputeOp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                        DispatchContext& ctx, bool* handled);

// Tuning hooks. Candidate config strings for (op, dtype, TuningKey); the first
// is the default (valid for every shape). Empty when the op is not the
// family's or has nothing to tune. The autotuner times each candidate by
// running the dispatcher with a ConfigLookup that returns it.
std::vector<std::string> MemoryBoundCandidates(const std::string& op, DType dtype, const std::vector<int64_t>& key);
std::vector<std::string> ComputeCandidates(const std::string& op, DType dtype, const std::vector<int64_t>& key);

}  // namespace fusedserve
