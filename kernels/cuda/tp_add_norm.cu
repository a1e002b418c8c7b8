// TpAddNorm (tp_add_norm.h): all-reduce + residual add + RMS norm in one
// kernel over NCCL's device API. Built where CMake found nccl_device.h
// (FUSEDSERVE_HAVE_NCCL_DEVICE_H); elsewhere Create says so.
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/tp_add_norm.h"

#if FUSEDSERVE_HAVE_NCCL_DEVICE_H
#include <nccl.h>
#include <nccl_device.h>
#endif

namespace fusedserve::cuda {

#if FUSEDSERVE_HAVE_NCCL_DEVICE_H

struct TpAddNorm::DevComm {
  ncclDevComm comm{};
};

namespace {

constexpr int kThreads = 512;
constexpr int kMaxPeers = 8;         // LSA teams of up to 8 GPUs (an NVLink host)
constexpr int64_t kDecodeRows = 64;  // up to this many rows, a block a row

// Rows blockIdx.x, + gridDim.x, ...: one row per block for decode steps, a
// grid of resident blocks looping over a prefill's rows. Each thread owns
// kPer 16-byte vectors of a row (in registers from the first pass to the
// second). kRanks > 0: the group size at compile time (the peer accesses
// unrolled, all in flight at once); 0: any size up to kMaxPeers.
//   pull (prefill)  `offset` is this buffer's [rows][hidden] partial sums in
//                   every rank's window; after the barrier each rank reads
//                   every peer's over NVLink.
//   push (decode)   `offset` is slot 0 of this buffer's [ranks][rows][hidden]
//                   slots; rank r's projection wrote slot r of its own
//                   window, and before the barrier r stores those rows into
//                   slot r of every peer's window (NVLink stores are
//                   fire-and-forget, the barrier's release orders them), so
//                   after it every read is local: one NVLink crossing on the
//                   critical path instead of the barrier's plus a load's
//                   round trip.
template <typename T, int kRanks, int kPer, bool kPush>
__global__ void __launch_bounds__(kThreads)
    AllReduceAddRmsKernel(ncclDevComm comm, ncclWindow_t window, size_t offset, size_t slot_bytes, int64_t rows,
                          int hidden, const T* residual, const T* weight, float eps, T* y, T* residual_out) {
  constexpr int kN = kVec16<T>;
  constexpr int kPeers = kRanks > 0 ? kRanks : kMaxPeers;
  using V = Vec<T, kN>;
  __shared__ float partials[kThreads / 32];
  const int ranks = kRanks > 0 ? kRanks : comm.lsaSize;
  const int me = comm.lsaRank;
  const int vectors = hidden / kN;
  // Before the wait, what does not depend on the projection just before:
  // the addresses (the window is fixed), the weight and the first row's
  // residual (written by the norm two or more kernels back, complete once
  // the previous kernel started).
  // src[p]: where rank p's sums are read (pull: p's window; push: slot p of
  // this rank's). dst[p] (push): slot `me` of p's window.
  const V* src[kPeers];
  V* dst[kPeers];
#pragma unroll
  for (int p = 0; p < kPeers; ++p) {
    if (p < ranks) {
      if constexpr (kPush) {
        src[p] = static_cast<const V*>(ncclGetLsaPointer(window, offset + p * slot_bytes, me));
        dst[p] = static_cast<V*>(ncclGetLsaPointer(window, offset + me * slot_bytes, p));
      } else {
        src[p] = static_cast<const V*>(ncclGetLsaPointer(window, offset, p));
      }
    }
  }
  V res[kPer], w[kPer];
  auto load_residual = [&](int64_t row) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      if (j < vectors) res[i].Load(residual + row * hidden + j * kN);
    }
  };
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j < vectors) w[i].Load(weight + j * kN);
  }
  load_residual(blockIdx.x);
  PdlEnter();  // the projection that wrote this rank's partials is done
  V mine[kPush ? kPer : 1];
  if constexpr (kPush) {  // one row per block
    const int64_t at = static_cast<int64_t>(blockIdx.x) * vectors;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      if (j >= vectors) continue;
      mine[i] = src[me][at + j];
#pragma unroll
      for (int p = 0; p < kPeers; ++p) {
        if (p < ranks && p != me) dst[p][at + j] = mine[i];
      }
    }
  }
  // Every rank's partials are written (release/acquire at system scope).
  ncclLsaBarrierSession<ncclCoopCta> barrier(ncclCoopCta(), comm, ncclTeamTagLsa(), blockIdx.x);
  barrier.sync(ncclCoopCta(), ::cuda::memory_order_acq_rel);

  struct Add {
    __device__ float operator()(float a, float b) const { return a + b; }
    __device__ static float Identity() { return 0.0f; }
  };
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (row != blockIdx.x) {
      __syncthreads();  // the previous row's reduction is read (one partials buffer)
      load_residual(row);
    }
    const int64_t at = row * vectors;  // in vectors
    float f[kPer][kN];
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      if (j >= vectors) continue;
      // Plain loads (not the read-only path): the peers wrote these bytes
      // while this kernel ran, before the barrier. Summed in rank order, the
      // same on every rank.
      V v[kRanks > 0 ? kRanks : 1];
      if constexpr (kRanks > 0) {
#pragma unroll
        for (int p = 0; p < kRanks; ++p) {
          if constexpr (kPush) {
            v[p] = p == me ? mine[i] : src[p][at + j];
          } else {
            v[p] = src[p][at + j];
          }
        }
      }
      res[i].ToFloats(f[i]);
      float g[kN] = {};
      for (int p = 0; p < ranks; ++p) {
        float h[kN];
        if constexpr (kRanks > 0) {
          v[p].ToFloats(h);
        } else {
          V u;
          if constexpr (kPush) {
            u = p == me ? mine[i] : src[p][at + j];
          } else {
            u = src[p][at + j];
          }
          u.ToFloats(h);
        }
#pragma unroll
        for (int e = 0; e < kN; ++e) g[e] += h[e];
      }
#pragma unroll
      for (int e = 0; e < kN; ++e) f[i][e] += g[e];
      // The sum is rounded to T: it is the residual the caller gets, and y
      // is the norm of that tensor (as the add_rms_norm kernel does).
      res[i].FromFloats(f[i]);
      res[i].Store(residual_out + (at + j) * kN);
      res[i].ToFloats(f[i]);
#pragma unroll
      for (int e = 0; e < kN; ++e) sum_sq += f[i][e] * f[i][e];
    }
    sum_sq = RowReduce(sum_sq, Add{}, static_cast<int>(blockDim.x), partials);
    const float inv = rsqrtf(sum_sq / static_cast<float>(hidden) + eps);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      if (j >= vectors) continue;
      float g[kN];
      w[i].ToFloats(g);
#pragma unroll
      for (int e = 0; e < kN; ++e) f[i][e] = f[i][e] * inv * g[e];
      V o;
      o.FromFloats(f[i]);
      o.Store(y + (at + j) * kN);
    }
  }
}

template <typename T, int kRanks, bool kPush>
CudaStatus LaunchFor(const ncclDevComm& comm, ncclWindow_t window, size_t offset, size_t slot_bytes, int64_t rows,
                     int64_t blocks, int64_t hidden, const void* residual, const void* weight, float eps, void* y,
                     void* residual_out, cudaStream_t stream) {
  // A power of two of warps (RowReduce), one 16-byte vector a thread where
  // it fits, else up to four.
  const int64_t vectors = hidden / kVec16<T>;
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, std::max<int64_t>(32, Pow2Ceil(vectors))));
  const int64_t per = CeilDiv(vectors, threads);
  auto launch = [&](auto kernel) {
    return LaunchKernel(kernel, dim3(static_cast<unsigned>(std::min(rows, blocks))), dim3(threads), 0, stream, 1, comm,
                        window, offset, slot_bytes, rows, static_cast<int>(hidden), static_cast<const T*>(residual),
                        static_cast<const T*>(weight), eps, static_cast<T*>(y), static_cast<T*>(residual_out));
  };
  switch (per) {
    case 1:
      return launch(AllReduceAddRmsKernel<T, kRanks, 1, kPush>);
    case 2:
      return launch(AllReduceAddRmsKernel<T, kRanks, 2, kPush>);
    case 3:
    case 4:
      return launch(AllReduceAddRmsKernel<T, kRanks, 4, kPush>);
    default:
      return CudaStatus::Error("fused all-reduce + norm: hidden " + std::to_string(hidden) + " is too large");
  }
}

std::string VersionName(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

}  // namespace

CudaStatus TpAddNorm::Create(const NcclGroup& group, int rank, int64_t max_rows, int64_t hidden, DType dtype,
                             std::unique_ptr<TpAddNorm>* out) {
  out->reset();
  if (group.version_code() != NCCL_VERSION_CODE)
    return CudaStatus::Error("NCCL device API built with nccl.h " + VersionName(NCCL_VERSION_CODE) +
                             ", the loaded library is " + group.version());
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16)
    return CudaStatus::Error("fused all-reduce + norm: float dtypes only");
  const int64_t es = static_cast<int64_t>(DTypeSize(dtype));
  if (max_rows < 1 || hidden < 1 || (hidden * es) % 16 != 0 || hidden * es > 4 * 16 * kThreads)
    return CudaStatus::Error("fused all-reduce + norm: hidden must be a multiple of 16 bytes, at most 32 KB");
  auto create = reinterpret_cast<decltype(&ncclDevCommCreate)>(group.Resolve("ncclDevCommCreate"));
  auto* host = static_cast<ncclComm_t>(group.comm(rank));
  if (create == nullptr || host == nullptr)
    return CudaStatus::Error("NCCL " + group.version() + " has no device API (ncclDevCommCreate)");
  std::unique_ptr<TpAddNorm> t(new TpAddNorm);
  t->group_ = &group;
  t->rank_ = rank;
  t->max_rows_ = max_rows;
  t->hidden_ = hidden;
  t->dtype_ = dtype;
  // [pull buffers 0, 1: max_rows rows each, for steps of more than
  // kDecodeRows rows][push buffers 0, 1: a slot of push_rows rows a rank].
  const int64_t row_bytes = hidden * es;
  t->push_rows_ = std::min(max_rows, kDecodeRows);
  t->slot_bytes_ = t->push_rows_ * row_bytes;
  t->pull_bytes_ = max_rows > t->push_rows_ ? 2 * max_rows * row_bytes : 0;
  void* base = nullptr;
  if (CudaStatus s = group.AllocateSymmetric(
          rank, static_cast<size_t>(t->pull_bytes_ + 2 * group.size() * t->slot_bytes_), &base, &t->window_);
      !s.ok())
    return s;
  t->base_ = static_cast<char*>(base);
  // One barrier a block: a row each up to kDecodeRows, else a grid of two
  // blocks an SM (all resident, so no block waits on a peer's block that
  // cannot be scheduled).
  int device = 0, sms = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&device)); !s.ok()) return s;
  if (CudaStatus s = FS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)); !s.ok())
    return s;
  t->blocks_ = std::min<int64_t>(max_rows, std::max<int64_t>(2 * sms, kDecodeRows));
  ncclDevCommRequirements reqs = {};
  reqs.lsaBarrierCount = static_cast<int>(t->blocks_);
  auto dev = std::make_unique<DevComm>();
  if (ncclResult_t r = create(host, &reqs, &dev->comm); r != ncclSuccess)
    return CudaStatus::Error("ncclDevCommCreate failed (NCCL error " + std::to_string(static_cast<int>(r)) + ")");
  t->dev_comm_ = std::move(dev);
  if (t->dev_comm_->comm.lsaSize != group.size() || t->dev_comm_->comm.lsaRank != rank || group.size() > kMaxPeers)
    return CudaStatus::Error("fused all-reduce + norm: " + std::to_string(t->dev_comm_->comm.lsaSize) + " of " +
                             std::to_string(group.size()) + " GPUs reach each other's memory (no NVLink/P2P)");
  *out = std::move(t);
  return CudaStatus::Ok();
}

void* TpAddNorm::partial_sums(int which, int64_t rows) const {
  if (rows <= push_rows_) return base_ + pull_bytes_ + (which * group_->size() + rank_) * slot_bytes_;
  return base_ + which * max_rows_ * hidden_ * static_cast<int64_t>(DTypeSize(dtype_));
}

CudaStatus TpAddNorm::Launch(int which, int64_t rows, const void* residual, const void* weight, float eps, void* y,
                             void* residual_out, cudaStream_t stream) const {
  if (which < 0 || which > 1 || rows < 1 || rows > max_rows_)
    return CudaStatus::Error("fused all-reduce + norm: " + std::to_string(rows) + " rows in buffer " +
                             std::to_string(which) + " (at most " + std::to_string(max_rows_) + " rows, buffers 0-1)");
  if (group_->comm(rank_) == nullptr) return CudaStatus::Error("fused all-reduce + norm: the group was aborted");
  const bool push = rows <= push_rows_;
  const size_t offset = push ? static_cast<size_t>(pull_bytes_ + which * group_->size() * slot_bytes_)
                             : static_cast<size_t>(which * max_rows_ * hidden_) * DTypeSize(dtype_);
  const size_t slot = push ? static_cast<size_t>(slot_bytes_) : 0;
  const auto window = static_cast<ncclWindow_t>(window_);
  const ncclDevComm& c = dev_comm_->comm;
  CudaStatus status = CudaStatus::Error("fused all-reduce + norm: unsupported dtype");
  DispatchFloatType(dtype_, [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto ranks, auto push_mode) {
      return LaunchFor<T, decltype(ranks)::value, decltype(push_mode)::value>(
          c, window, offset, slot, rows, blocks_, hidden_, residual, weight, eps, y, residual_out, stream);
    };
    auto with_ranks = [&](auto push_mode) {
      switch (c.lsaSize) {
        case 2:
          return launch(std::integral_constant<int, 2>{}, push_mode);
        case 4:
          return launch(std::integral_constant<int, 4>{}, push_mode);
        case 8:
          return launch(std::integral_constant<int, 8>{}, push_mode);
        default:
          return launch(std::integral_constant<int, 0>{}, push_mode);
      }
    };
    status = push ? with_ranks(std::true_type{}) : with_ranks(std::false_type{});
  });
  return status;
}

#else  // no nccl_device.h at configure time

struct TpAddNorm::DevComm {};

CudaStatus TpAddNorm::Create(const NcclGroup&, int, int64_t, int64_t, DType, std::unique_ptr<TpAddNorm>* out) {
  out->reset();
  return CudaStatus::Error("this build has no NCCL device API (nccl_device.h, NCCL 2.28+, was not found)");
}
void* TpAddNorm::partial_sums(int, int64_t) const { return nullptr; }
CudaStatus TpAddNorm::Launch(int, int64_t, const void*, const void*, float, void*, void*, cudaStream_t) const {
  return CudaStatus::Error("this build has no NCCL device API");
}

#endif

// The window and the device communicator's resources go with the group's
// communicators (ncclDevCommDestroy is collective, and ranks are destroyed
// one after another on one thread).
TpAddNorm::~TpAddNorm() = default;

}  // namespace fusedserve::cuda
