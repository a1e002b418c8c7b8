// Device scratch for the GPU tests: grown on demand like the backend's, and
// filled with 0xFF bytes (NaN in every float dtype) whenever it is
// (re)allocated, so a kernel that reads scratch it did not write fails.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/dispatch.h"

namespace fusedserve {

class PoisonedScratch : public Scratch {
 public:
  ~PoisonedScratch() override {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  CudaStatus Get(size_t bytes, void** ptr) override {
    if (bytes > size_) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = nullptr;
      size_ = 0;
      if (CudaStatus s = FS_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); !s.ok()) return s;
      if (CudaStatus s = FS_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes)); !s.ok()) return s;
      size_ = bytes;
    }
    *ptr = ptr_;
    return CudaStatus::Ok();
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fusedserve
