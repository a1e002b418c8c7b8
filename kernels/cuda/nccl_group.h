// NcclGroup: one NCCL communicator per GPU of this process, for the
// tensor-parallel all-reduces (issue 15). libnccl.so.2 is loaded at run time
// (dlopen) rather than linked: the same binary serves with one GPU on a host
// that has no NCCL, and a group of N > 1 fails with a clear error there.
//
// The calling convention is NCCL's: every rank of the group must issue the
// same collectives in the same order, each on its own stream, either from one
// thread per rank or from one thread between GroupStart() and GroupEnd().
// Collectives may be captured into CUDA graphs (NCCL >= 2.9).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

struct NcclApi;  // NCCL's functions, resolved at run time (nccl_group.cc)

class NcclGroup {
 public:
  // Communicators over `devices` (CUDA ordinals, distinct), rank i on
  // devices[i] (ncclCommInitAll). Fails, naming the cause, when NCCL cannot be
  // loaded, a device is listed twice or missing, or NCCL's init fails.
  static CudaStatus Create(const std::vector<int>& devices, std::unique_ptr<NcclGroup>* out);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_[rank]; }
  // "2.28.9": the loaded library's version.
  const std::string& version() const { return version_; }

  // In place: data (count elements of dtype on rank's device) becomes the sum
  // over the group's ranks, enqueued on `stream` (a stream of rank's device).
  CudaStatus AllReduceSum(int rank, void* data, size_t count, DType dtype, cudaStream_t stream) const;
  // recv (size() x count elements, rank r's part at r x count) gets every
  // rank's `count` elements of send.
  CudaStatus AllGather(int rank, const void* send, void* recv, size_t count, DType dtype, cudaStream_t stream) const;
  // Symmetric memory (NCCL >= 2.27): `bytes` on rank's device (ncclMemAlloc)
  // registered on its communicator as a symmetric window. All-reduces inside
  // such buffers run NCCL's symmetric kernels, which load and store straight
  // over NVLink: the latency-bound decode all-reduces get cheaper.
  // Registration is collective: every rank at once, each from its own thread
  // (or one thread between GroupStart and GroupEnd). Freed with the group.
  // Fails, naming why, where the library lacks the API.
  // `window` (optional) gets the ncclWindow_t, for kernels on NCCL's device
  // API (tp_add_norm.h).
  CudaStatus AllocateSymmetric(int rank, size_t bytes, void** ptr, void** window = nullptr) const;
  // For code on NCCL's device API: rank's ncclComm_t (null once aborted), the
  // loaded library's NCCL_VERSION_CODE, and a function of the loaded library
  // by name (null where it lacks it).
  void* comm(int rank) const { return comms_.empty() ? nullptr : comms_[rank]; }
  int version_code() const { return version_code_; }
  void* Resolve(const char* name) const;
  // Brackets the collectives of several ranks issued from one thread.
  CudaStatus GroupStart() const;
  CudaStatus GroupEnd() const;
  // Aborts every communicator (ncclCommAbort; safe from another thread while
  // collectives are in flight): a rank that failed between collectives would
  // otherwise leave the others waiting on the GPU for ever. The group is
  // unusable afterwards.
  void Abort();

 private:
  NcclGroup() = default;
  const NcclApi* api_ = nullptr;
  std::vector<int> devices_;
  std::vector<void*> comms_;  // ncclComm_t per rank; empty once aborted
  std::string version_;
  int version_code_ = 0;
  struct Window {
    int rank;
    void* ptr;
    void* window;  // ncclWindow_t
  };
  mutable std::mutex windows_mu_;  // ranks register at once
  mutable std::vector<Window> windows_;
};

// True when libnccl.so.2 can be loaded here (no device needed).
bool NcclAvailable(std::string* why_not = nullptr);

}  // namespace fusedserve::cuda
