// What the sm_90a kernels share (attention_hopper.cu, gemm_hopper.cu,
// skinny_hopper.cu): mbarriers, TMA loads, wgmma fences and shared-memory
// descriptors, the driver's tensor-map encoder and a per-device "is this a
// compute capability 9.0 GPU" cache. Included only by files compiled for sm_90a.
#pragma once

#include <cuda.h>  // CUtensorMap and the encoder's types; the function itself comes through the runtime
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

// ---- mbarrier ------------------------------------------------------------------

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
  }
}

// ---- TMA -------------------------------------------------------------------------

// One box of a 2D map ({column, row}) into shared memory, completing on `bar`.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// ---- wgmma -----------------------------------------------------------------------

// K-major operand in 128B-swizzled shared memory: rows of 128 bytes, 8-row
// atoms 1024 bytes apart (stride byte offset); the leading byte offset is
// unused for swizzled K-major layouts. A k-step of 16 elements (32 bytes)
// inside the swizzle row advances the start address by 2 (units of 16 B).
__device__ __forceinline__ uint64_t SmemDesc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// ---- host side -----------------------------------------------------------------

// cuTensorMapEncodeTiled through the runtime's driver entry point (no
// -lcuda); null where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // clear the error so later launch checks do not report it
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A [rows, cols] row-major bf16/fp16 tensor moved in boxes of box_rows rows x
// 64 columns (one 128-byte swizzle row), 128B-swizzled; out-of-bounds rows and
// columns read as zeros and are not written. `who` names the caller in errors.
inline CudaStatus EncodeRowMajorMap(CUtensorMap* map, DType dt, const void* base, int64_t rows, int64_t cols,
                                    int box_rows, const char* who) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return CudaStatus::Error(std::string(who) + ": cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * 2};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(map, dt == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
             const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return CudaStatus::Error(std::string(who) + ": cuTensorMapEncodeTiled failed (" +
                             std::to_string(static_cast<int>(r)) + ") rows=" + std::to_string(rows) +
                             " cols=" + std::to_string(cols));
  }
  return CudaStatus::Ok();
}

// Clusters of `cluster` CTAs (threads and dynamic shared memory each) of
// `kernel` that the current device runs at once.
template <typename Kernel>
CudaStatus MaxActiveClusters(Kernel kernel, int cluster, int threads, size_t smem, int* n) {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.gridDim = dim3(static_cast<unsigned>(cluster));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return FS_CUDA_CHECK(cudaOccupancyMaxActiveClusters(n, kernel, &cfg));
}

// The current device, queried once: (SM count << 1) | 1 if it is compute
// capability 9.0 with a tensor-map encoder; 0 if the query failed.
inline int HopperDeviceInfo() {
  static std::atomic<int> info[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return 0;
  }
  int v = info[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    v = (std::max(sms, 1) << 1) | (major == 9 && minor == 0 && TensorMapEncoder() != nullptr ? 1 : 0);
    info[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

}  // namespace fusedserve::cuda
