// The seam between the CUDA backend (buffers, transfers, locking) and the op
// families (which launcher to call with which config): the CUDA half of the
// op registry (kernels/op.h). Plain C++: the <family>_op.cc files are
// compiled by the host compiler and call launchers from the family headers
// (norm.h, softmax.h, ...), whose kernels live in .cu files.
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

// An op's CUDA entry: its dispatch (request -> the family's params and typed
// config -> launcher) and its tuning candidates. Each family defines its
// entries beside its kernels (kernels/cuda/<family>_op.cc); the CUDA table
// (dispatch.cc) lists them by op name and indexes them by OpSpec::id.
struct CudaOp {
  std::string op;  // OpSpec::name
  // Shapes come from the device tensors; the host request supplies
  // attributes and host copies of index inputs.
  CudaStatus (*run)(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out,
                    DispatchContext& ctx) = nullptr;
  // Candidate config strings for (dtype, TuningKey); the first is the
  // default (valid for every shape). The autotuner times each by running
  // the op with a ConfigLookup that returns it. Null: nothing to tune.
  std::vector<std::string> (*candidates)(DType dtype, const std::vector<int64_t>& key) = nullptr;
};

// Each family's entries, gathered by the CUDA table.
std::vector<CudaOp> NormCudaOps();
std::vector<CudaOp> SoftmaxCudaOps();
std::vector<CudaOp> ActivationCudaOps();
std::vector<CudaOp> RopeCudaOps();
std::vector<CudaOp> LinearCudaOps();
std::vector<CudaOp> SwigluMlpCudaOps();
std::vector<CudaOp> AttentionCudaOps();

// The CUDA entry of an op; nullptr when it has no CUDA kernel.
const CudaOp* FindCudaOp(const OpSpec& spec);

// Runs a validated request's op. *handled is false (and nothing runs) when
// the op has no CUDA entry.
CudaStatus RunCudaOp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out, DispatchContext& ctx,
                     bool* handled);
// The op's candidates for (dtype, key): empty when the op is unknown, has no
// CUDA entry, nothing to tune, or the key has the wrong rank.
std::vector<std::string> CudaCandidates(const std::string& op, DType dtype, const std::vector<int64_t>& key);

// The config strings of a family's typed candidates (CudaOp::candidates).
template <typename Config>
std::vector<std::string> FormatAll(const std::vector<Config>& configs, std::string (*format)(const Config&)) {
  std::vector<std::string> out;
  for (const Config& c : configs) out.push_back(format(c));
  return out;
}

// The tuned config string of a request ("" when there is none).
std::string ConfigOf(const DispatchContext& ctx, const OpRequest& host, DType dtype);
// The device tensor `name` of `m`, or nullptr.
const DeviceTensor* FindTensor(const DeviceTensorMap& m, const std::string& name);

}  // namespace fusedserve
