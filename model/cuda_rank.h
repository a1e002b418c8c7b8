// Inside the CUDA runner: one tensor-parallel rank (cuda_runner.cc) and the
// runner that drives a group of them (cuda_tensor_parallel.cc). Only built
// with CUDA (FUSEDSERVE_HAVE_CUDA).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/nccl_group.h"
#include "model/cuda_runner.h"
#include "model/tensor_parallel.h"

namespace fusedserve {

// The CUDA runner over `shard` of the model on `device`; `group` (null when
// unsharded) carries its all-reduces. Reads the weights only while loading.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaRankRunner(const ModelWeights& weights,
                                                                const CudaModelRunnerOptions& options,
                                                                const TensorShard& shard, const cuda::NcclGroup* group,
                                                                int device);

// options.tensor_parallel ranks on GPUs options.device, options.device + 1,
// ..., behind one ModelRunner: every call runs on all ranks at once, each
// on its own thread (NCCL's one thread per communicator), and answers with
// rank 0's result.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCudaTensorParallelRunner(std::unique_ptr<ModelWeights> weights,
                                                                          const CudaModelRunnerOptions& options);

}  // namespace fusedserve
