// Dispatch of the memory-bound ops (norms, softmax, activations, rope) to
// their CUDA launchers. Placeholder until the kernels land.
#include "kernels/cuda/dispatch.h"

namespace fusedserve {

CudaStatus RunMemoryBoundOp(const OpRequest&, const DeviceTensorMap&, const DeviceTensorMap&, DispatchContext&,
                            bool* handled) {
  *handled = false;
  return CudaStatus::Ok();
}

std::vector<std::string> MemoryBoundCandidates(const std::string&, DType, const std::vector<int64_t>&) { return {}; }

}  // namespace fusedserve
