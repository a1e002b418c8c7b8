// TpAddNorm: a tensor-parallel rank's all-reduce fused with the residual add
// and RMS norm that follow it (issue 15), on NCCL's device API (2.28+).
//
// Each rank's row-parallel projection (o_proj, down) writes its partial sums
// into an NCCL symmetric window; one kernel per rank then waits on an NCCL
// LSA barrier (every rank's partials are written), reads the N partials of
// its rows straight from the peers' windows over NVLink, sums them in rank
// order in fp32 (every rank gets the same bits), adds the residual and
// writes residual_out and rms_norm(residual_out) * weight: one launch where
// the plain path runs NCCL's all-reduce kernel and then the add_rms_norm
// kernel (two launches, two drains, a bf16 rounding of the sum).
//
// Decode steps (up to 64 rows) push instead: each rank stores its rows into
// its slot of every peer's window before the barrier, and after it reads
// only its own window.
//
// Two buffers alternate (o_proj's sums in 0, down's in 1): a rank rewrites
// buffer b (its own, or its slot in a peer's) only after its next launch's
// barrier, which every peer reaches only after its launch over b finished
// reading b. One barrier a launch.
//
// ncclCommAbort does not release a launch waiting in the barrier for a rank
// that never launches (NCCL's own kernels poll an abort flag; this one does
// not): a rank that fails between collectives hangs its peers' streams.
//
// The device API is inline code over the library's own structures, so it is
// used only when the loaded libnccl.so.2 is the version whose headers this
// file was compiled with, and every rank is load/store-accessible from the
// others (NVLink or PCIe P2P); Create says why not otherwise and the caller
// keeps the plain path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

class TpAddNorm {
 public:
  // Collective: every rank of `group` at once, each from its own thread with
  // its device current. Rows up to max_rows of `hidden` elements of dtype
  // (a float type; hidden a multiple of 16 bytes' elements).
  static CudaStatus Create(const NcclGroup& group, int rank, int64_t max_rows, int64_t hidden, DType dtype,
                           std::unique_ptr<TpAddNorm>* out);
  ~TpAddNorm();
  TpAddNorm(const TpAddNorm&) = delete;
  TpAddNorm& operator=(const TpAddNorm&) = delete;

  int64_t max_rows() const { return max_rows_; }
  // Where this rank's projection writes its [rows, hidden] partial sums for
  // buffer `which` (0 or 1) in a step of `rows` rows.
  void* partial_sums(int which, int64_t rows) const;
  // residual_out = sum over ranks of partial_sums(which) + residual;
  // y = rms_norm(residual_out) * weight. rows <= max_rows; every rank must
  // launch the same sequence of (which, rows).
  CudaStatus Launch(int which, int64_t rows, const void* residual, const void* weight, float eps, void* y,
                    void* residual_out, cudaStream_t stream) const;

 private:
  struct DevComm;  // ncclDevComm (tp_add_norm.cu)
  TpAddNorm() = default;
  const NcclGroup* group_ = nullptr;
  int rank_ = 0;
  int64_t max_rows_ = 0, hidden_ = 0;
  int64_t blocks_ = 0;  // the most blocks a launch runs (one barrier each)
  // Steps of up to push_rows_ rows push their sums into every peer's slot
  // (tp_add_norm.cu); the push buffers start pull_bytes_ into the window.
  int64_t push_rows_ = 0, slot_bytes_ = 0, pull_bytes_ = 0;
  DType dtype_ = DType::kBF16;
  char* base_ = nullptr;    // this rank's window: buffer 0, then buffer 1
  void* window_ = nullptr;  // ncclWindow_t
  std::unique_ptr<DevComm> dev_comm_;
};

}  // namespace fusedserve::cuda
