// The two memory holders of the CUDA code, for the backend, the model runner
// and the autotuner alike: device memory and pinned host memory, each freed
// on destruction. Get() grows (never shrinks: scratch reused across calls);
// Allocate() sizes exactly. Errors are CudaStatus (out_of_memory set when the
// allocation failed), turned into absl::Status by CudaToAbsl.
// Plain C++ header.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dispatch.h"

namespace fusedserve {

// Device memory; also the dispatcher's scratch (Scratch::Get).
class DeviceBuffer : public Scratch {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() override { Free(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes` (the old contents are lost when it grows).
  CudaStatus Get(size_t bytes, void** ptr) override {
    if (bytes > size_) {
      if (CudaStatus s = Allocate(bytes); !s.ok()) return s;
    }
    *ptr = ptr_;
    return CudaStatus::Ok();
  }
  // Exactly `bytes` (0: none).
  CudaStatus Allocate(size_t bytes) {
    Free();
    if (bytes == 0) return CudaStatus::Ok();
    if (CudaStatus s = FS_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); !s.ok()) {
      ptr_ = nullptr;
      return s;
    }
    size_ = bytes;
    return CudaStatus::Ok();
  }
  void Free() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

// Pinned host memory, mapped into the device's address space (device()).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Free(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes`; *device (if asked) is the same memory as kernels see it.
  CudaStatus Get(size_t bytes, char** ptr, char** device = nullptr) {
    if (bytes > size_) {
      if (CudaStatus s = Allocate(bytes); !s.ok()) return s;
    }
    *ptr = static_cast<char*>(ptr_);
    if (device != nullptr) *device = static_cast<char*>(dev_);
    return CudaStatus::Ok();
  }
  CudaStatus Allocate(size_t bytes) {
    Free();
    if (bytes == 0) return CudaStatus::Ok();
    if (CudaStatus s = FS_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocMapped)); !s.ok()) {
      ptr_ = nullptr;
      return s;
    }
    if (CudaStatus s = FS_CUDA_CHECK(cudaHostGetDevicePointer(&dev_, ptr_, 0)); !s.ok()) {
      Free();
      return s;
    }
    size_ = bytes;
    return CudaStatus::Ok();
  }
  void Free() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    dev_ = nullptr;
    size_ = 0;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* device() const { return dev_; }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  void* dev_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fusedserve
