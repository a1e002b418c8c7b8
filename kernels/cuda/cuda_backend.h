// The CUDA backend: owns the device, its lanes (a stream with reusable device
// and pinned host buffers each); runs each op through the family dispatchers.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dispatch.h"

namespace fusedserve {

// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int CudaDeviceCount();

// The one mapping of CUDA errors to status codes: unsupported shapes are
// INVALID_ARGUMENT, out of device memory RESOURCE_EXHAUSTED, the rest
// INTERNAL. `what` (may be empty) prefixes the message.
absl::Status CudaToAbsl(const CudaStatus& s, const std::string& what = "");

constexpr int kMaxCudaSmallOpLanes = 64;

// config may be empty (every op uses its default config). small_op_lanes
// (1..kMaxCudaSmallOpLanes): how many small memory-bound launches (the
// zero-copy ones, up to 1 MiB) run side by side, each on a stream of its own;
// every other launch runs one at a time.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device, ConfigLookup config, int small_op_lanes = 1);

}  // namespace fusedserve
