// Dispatch of the compute-bound ops (linear, swiglu_mlp, attention) to
// their CUDA launchers. Placeholder until the kernels land.
#include "kernels/cuda/dispatch.h"

namespace fusedserve {

CudaStatus RunComputeOp(const OpRequest&, const DeviceTensorMap&, const DeviceTensorMap&, DispatchContext&,
                            bool* handled) {
  *handled = false;
  return CudaStatus::Ok();
}

std::vector<std::string> ComputeCandidates(const std::string&, DType, const std::vector<int64_t>&) { return {}; }

}  // namespace fusedserve
