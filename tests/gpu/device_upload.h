// Device copies of host data for the GPU tests that drive kernels directly:
// each allocation is appended to the caller's cleanup list (cudaFree them
// when done). Failures are test failures, not crashes.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace fusedserve {

// A device copy of n bytes at `data` (at least 16 bytes allocated).
inline void* UploadBytes(const void* data, size_t n, std::vector<void*>* allocs) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 16)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, data, n, cudaMemcpyHostToDevice), cudaSuccess);
  allocs->push_back(p);
  return p;
}
inline void* UploadBytes(const std::string& bytes, std::vector<void*>* allocs) {
  return UploadBytes(bytes.data(), bytes.size(), allocs);
}

// A device copy of a host vector.
template <typename T>
T* Upload(const std::vector<T>& v, std::vector<void*>* allocs) {
  return static_cast<T*>(UploadBytes(v.data(), v.size() * sizeof(T), allocs));
}

}  // namespace fusedserve
