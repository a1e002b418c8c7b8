// Status values for code built with nvcc (Abseil stays out of .cu files):
// a CUDA/cuBLAS error recorded with the call and file:line, turned into an
// absl::Status at the backend boundary.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace fusedserve {

struct CudaStatus {
  std::string message;  // empty on success
  // True when the request is valid by the API but this backend cannot run it
  // (e.g. an unsupported head dim): reported as INVALID_ARGUMENT, not INTERNAL.
  bool unsupported = false;
  // True when the device ran out of memory: RESOURCE_EXHAUSTED for that
  // request alone, never a crash.
  bool out_of_memory = false;
  bool ok() const { return message.empty(); }
  static CudaStatus Ok() { return {}; }
  static CudaStatus Error(std::string m) { return {std::move(m), false}; }
  static CudaStatus Unsupported(std::string m) { return {std::move(m), true, false}; }
};

inline CudaStatus CheckCuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return CudaStatus::Ok();
  CudaStatus s = CudaStatus::Error(std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                                   cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  s.out_of_memory = err == cudaErrorMemoryAllocation;
  return s;
}

// Records the expression and location; the caller decides what to do:
//   if (CudaStatus s = FS_CUDA_CHECK(cudaMemsetAsync(...)); !s.ok()) return s;
#define FS_CUDA_CHECK(expr) ::fusedserve::CheckCuda((expr), #expr, __FILE__, __LINE__)

// After a kernel launch: catches bad launch configurations.
#define FS_CUDA_CHECK_LAUNCH() ::fusedserve::CheckCuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

}  // namespace fusedserve
