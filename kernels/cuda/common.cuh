// Shared device helpers for the memory-bound kernels (norm, softmax,
// activation, rope): the one vector load/store type, fp32 conversions of the
// three float dtypes, warp and row reductions, and the host-side dtype switch.
// Every kernel loads and stores in the tensor's dtype through Vec<T, kN> and
// accumulates in fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cxxabi.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/env_knob.h"
#include "kernels/dtype.h"

namespace fusedserve::cuda {

// ---- element types -----------------------------------------------------------

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Elements per 16-byte access: 8 for bf16/fp16, 4 for fp32.
template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// ---- the vector type ---------------------------------------------------------

// kN consecutive elements, loaded and stored with one access: 16 bytes when
// kN == kVec16<T> (LDG.E.128 / STG.E.128), one element when kN == 1 (the
// scalar path for sizes or pointers that are not 16-byte aligned).
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Vec {
  T v[kN];

  // Read-only (non-coherent) path: the inputs are never written by the kernel.
  __device__ __forceinline__ void Load(const T* p) {
    if constexpr (sizeof(T) * kN == 16) {
      const uint4 r = __ldg(reinterpret_cast<const uint4*>(p));
      *reinterpret_cast<uint4*>(v) = r;
    } else {
      *this = *reinterpret_cast<const Vec*>(p);
    }
  }
  __device__ __forceinline__ void Store(T* p) const { *reinterpret_cast<Vec*>(p) = *this; }

  // Makes the compiler treat the raw registers as rewritten, so fp32
  // conversions from an earlier pass over a register-resident row are
  // recomputed (one cheap instruction each) instead of being kept live:
  // without it a row held as packed bf16 is also held as fp32, doubling
  // the registers (seen in the -Xptxas -v report: 84 -> 50 for rms_norm).
  __device__ __forceinline__ void Launder() {
    if constexpr (sizeof(T) * kN == 16) {
      uint4& r = *reinterpret_cast<uint4*>(v);
      asm volatile("" : "+r"(r.x), "+r"(r.y), "+r"(r.z), "+r"(r.w));
    } else if constexpr (sizeof(T) * kN == 4) {
      uint32_t& r = *reinterpret_cast<uint32_t*>(v);
      asm volatile("" : "+r"(r));
    } else if constexpr (sizeof(T) * kN == 2) {
      unsigned short& r = *reinterpret_cast<unsigned short*>(v);
      asm volatile("" : "+h"(r));
    }
  }

  __device__ __forceinline__ void ToFloats(float (&f)[kN]) const {
#pragma unroll
    for (int i = 0; i < kN; ++i) f[i] = ToFloat(v[i]);
  }
  __device__ __forceinline__ void FromFloats(const float (&f)[kN]) {
    if constexpr (kN % 2 == 0 && sizeof(T) == 2) {
      // Paired conversions: one cvt.rn.{bf16x2,f16x2}.f32 per two elements.
#pragma unroll
      for (int i = 0; i < kN; i += 2) {
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
          *reinterpret_cast<__nv_bfloat162*>(&v[i]) = __floats2bfloat162_rn(f[i], f[i + 1]);
        } else {
          *reinterpret_cast<__half2*>(&v[i]) = __floats2half2_rn(f[i], f[i + 1]);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i) v[i] = FromFloat<T>(f[i]);
    }
  }
};

// True when p is 16-byte aligned (host or device).
__host__ __device__ inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- reductions --------------------------------------------------------------

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  static __device__ __forceinline__ float Identity() { return 0.0f; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  static __device__ __forceinline__ float Identity() { return -INFINITY; }
};

// Running (max, sum of exp(x - max)) of a softmax row segment.
struct MaxSum {
  float m;
  float s;
};
struct MaxSumOp {
  __device__ __forceinline__ MaxSum operator()(MaxSum a, MaxSum b) const {
    const float m = fmaxf(a.m, b.m);
    if (m == -INFINITY) return {m, 0.0f};  // both empty: avoid exp(-inf - -inf)
    return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
  }
  static __device__ __forceinline__ MaxSum Identity() { return {-INFINITY, 0.0f}; }
};

// Sum of pairs: (sum, sum of squares) of layer_norm's shifted values.
struct Sum2Op {
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const { return {a.x + b.x, a.y + b.y}; }
  static __device__ __forceinline__ float2 Identity() { return {0.0f, 0.0f}; }
};

__device__ __forceinline__ float ShflXor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
__device__ __forceinline__ MaxSum ShflXor(MaxSum v, int lane_mask) {
  return {__shfl_xor_sync(0xffffffffu, v.m, lane_mask), __shfl_xor_sync(0xffffffffu, v.s, lane_mask)};
}

__device__ __forceinline__ float2 ShflXor(float2 v, int lane_mask) {
  return {__shfl_xor_sync(0xffffffffu, v.x, lane_mask), __shfl_xor_sync(0xffffffffu, v.y, lane_mask)};
}

// Butterfly reduction over aligned groups of `width` lanes (a power of two
// <= 32); every lane of the group gets the result.
template <typename V, typename Op>
__device__ __forceinline__ V GroupReduce(V v, Op op, int width) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    if (o < width) v = op(v, ShflXor(v, o));
  }
  return v;
}

// Reduction over the threads of one row when a block holds several rows of
// `tpr` threads each, laid out contiguously (row r = threads [r*tpr, (r+1)*tpr)).
// tpr is a power of two: up to 32, shuffles only; above, shuffles, per-warp
// partials through `smem` (blockDim.x / 32 slots), and every warp of the row
// butterflies over those partials (5 shuffle steps, not a serial loop). Every
// thread of the block must call it (it has a __syncthreads) and every thread
// of the row gets the result. Once per `smem` buffer: there is no trailing
// barrier, so a second reduction needs its own buffer.
template <typename V, typename Op>
__device__ __forceinline__ V RowReduce(V v, Op op, int tpr, V* smem) {
  if (tpr <= 32) return GroupReduce(v, op, tpr);
  v = GroupReduce(v, op, 32);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  const int warps_per_row = tpr >> 5;
  const int first = (warp / warps_per_row) * warps_per_row;
  V r = lane < warps_per_row ? smem[first + lane] : Op::Identity();
  return GroupReduce(r, op, 32);  // all 32 lanes, so every lane gets the total
}

// ---- tensor cores ---------------------------------------------------------------

// c += a . b for one m16n8k16 tile, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void Mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void Mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one 32-bit register of two 16-bit elements (lo first):
// an mma fragment register.
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The transpose of an 8x8 matrix of 16-bit elements held one row pair per
// lane (lane l: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1), in the same
// layout: lane l gets elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4).
__device__ __forceinline__ uint32_t MovMatrixTrans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

// ---- cross-block merges ---------------------------------------------------------

// For kernels whose blocks each publish a partial result and let the last
// one to finish merge them (no second kernel). Called by one thread of a
// block once the block's partials are written (and fenced, when other
// threads wrote them): true in the last of `blocks` blocks, which resets
// the counter so the next launch (or CUDA graph replay) starts from zero.
// The caller fences again before reading the other blocks' partials, and
// reads them past L1 (__ldcg).
__device__ __forceinline__ bool LastBlockToFinish(unsigned* counter, unsigned blocks) {
  __threadfence();
  const bool last = atomicAdd(counter, 1u) == blocks - 1;
  if (last) *counter = 0;
  return last;
}

// ---- cp.async: 16-byte copies global -> shared that bypass registers and L1 ----
// Each thread waits only for its own copies (commit groups are per thread).

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: fill with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
// A streamed copy: evict-first in L2 (`policy` from EvictFirstPolicy), so
// bytes read once do not push out what is read again. The memory clobber
// keeps this thread's earlier reads of the slot ahead of the overwrite.
__device__ __forceinline__ void CpAsync16Stream(void* smem, const void* gmem, uint64_t policy) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "l"(policy)
               : "memory");
}
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Waits until at most `kPending` of this thread's newest groups are in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- programmatic dependent launch (Hopper) ------------------------------------
//
// Every kernel here is launched with programmatic stream serialization: the
// next kernel in the stream may be scheduled while this one still runs, and
// each kernel waits (griddepcontrol.wait) for its predecessor to complete and
// flush before touching global memory. That hides the launch latency between
// back-to-back kernels (the largest cost at M <= 32) and is correct whatever
// the predecessor is. FUSEDSERVE_PDL=0 in the environment turns it off.

// Waits for the previous grid in the stream to complete (memory flushed),
// then lets the next grid launch: at most one grid waits behind a running
// one. Every kernel calls it before its first global load; only L2
// prefetches (PrefetchL2) may precede it.
__device__ __forceinline__ void PdlEnter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Bulk prefetch of [p, p + bytes) into L2 (p 16-byte aligned, bytes a
// multiple of 16, inside one tensor). Issued before PdlEnter, it overlaps
// this kernel's first HBM round trip with the previous kernel's tail. That
// is safe even when the previous kernel writes these bytes: L2 is the point
// of coherence for global memory and L1 is write-through, so the later loads
// see the previous kernel's stores; only the HBM latency is hidden.
__device__ __forceinline__ void PrefetchL2(const void* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes > 0) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(static_cast<uint32_t>(bytes)) : "memory");
  }
#endif
}

inline bool PdlEnabled() {
  static const bool on = EnvKnob("FUSEDSERVE_PDL", 0, 1, 1) != 0;
  return on;
}

// Blocks of `block_threads` that an H100-class GPU holds at once (threads
// limit only): the ones that may run while the previous kernel finishes, so
// the ones that prefetch. 0 when PDL is off (a prefetch right before the
// load only adds traffic).
inline int64_t PrefetchBlocks(int block_threads) {
  if (!PdlEnabled()) return 0;
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      cudaGetLastError();
      return 132;
    }
    return n;
  }();
  return static_cast<int64_t>(sms) * std::max(1, 2048 / std::max(1, block_threads));
}

// An NVTX range around one launch, named for the kernel (demangled, with its
// template arguments: the tile config), so an nsys timeline shows which
// launch belongs to which op call. Without a profiler attached NVTX v3 is a
// null-pointer check; the name is built once per kernel and thread.
class KernelRange {
 public:
  explicit KernelRange(const void* kernel) {
    thread_local std::unordered_map<const void*, std::string> names;
    auto it = names.find(kernel);
    if (it == names.end()) it = names.emplace(kernel, KernelName(kernel)).first;
    nvtxRangePushA(it->second.c_str());
  }
  ~KernelRange() { nvtxRangePop(); }
  KernelRange(const KernelRange&) = delete;
  KernelRange& operator=(const KernelRange&) = delete;

 private:
  static std::string KernelName(const void* kernel) {
    const char* mangled = nullptr;
    if (cudaFuncGetName(&mangled, kernel) != cudaSuccess || mangled == nullptr) {
      cudaGetLastError();
      return "kernel";
    }
    int status = 0;
    char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled != nullptr ? demangled : mangled;
    std::free(demangled);
    return name;
  }
};

// Launches kernel<<<grid, block, smem, stream>>>(args...) with PDL and, when
// cluster > 1, a 1-D thread-block cluster of that size.
template <typename... KernelArgs, typename... Args>
CudaStatus LaunchKernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        int cluster, Args&&... args) {
  const KernelRange range(reinterpret_cast<const void*>(kernel));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (PdlEnabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return FS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Blocks of `threads` threads of `kernel` (with `smem` bytes of dynamic
// shared memory each) the current device holds at once (SMs x blocks per
// SM): the size of one full wave. Queried once per device, kernel, block
// size and shared memory; eager launches (FusedOp's GEMV) would otherwise
// pay the occupancy query on every launch.
inline CudaStatus ResidentBlocksOf(const void* kernel, int threads, size_t smem, int64_t* blocks) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, size_t>, int64_t> cache;
  int device = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&device)); !s.ok()) return s;
  const auto key = std::make_tuple(device, kernel, threads, smem);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) {
    *blocks = it->second;
    return CudaStatus::Ok();
  }
  int sms = 0, per_sm = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)); !s.ok())
    return s;
  if (CudaStatus s = FS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
      !s.ok())
    return s;
  *blocks = static_cast<int64_t>(std::max(1, sms)) * std::max(1, per_sm);
  cache.emplace(key, *blocks);
  return CudaStatus::Ok();
}
template <typename Kernel>
CudaStatus ResidentBlocks(Kernel kernel, int threads, int64_t* blocks, size_t smem = 0) {
  return ResidentBlocksOf(reinterpret_cast<const void*>(kernel), threads, smem, blocks);
}

// Dynamic shared memory a block asks for so that an SM holds at most `cap`
// of them (0 when that would take more than the 48 KB a launch gets without
// opting in).
inline CudaStatus SharedMemoryForBlockCap(int cap, size_t* smem) {
  int device = 0, per_sm = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&device)); !s.ok()) return s;
  if (CudaStatus s =
          FS_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
      !s.ok())
    return s;
  const size_t bytes = static_cast<size_t>(per_sm) / (cap + 1);  // cap + 1 blocks no longer fit
  *smem = bytes <= 48 * 1024 ? bytes : 0;
  return CudaStatus::Ok();
}

__host__ __device__ inline int64_t CeilDivDevice(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- host side -----------------------------------------------------------------

// Multiply-shift division by a runtime constant d (1 <= d < 2^31) for
// dividends below 2^31: q = umulhi(n, mul) >> shift (mul = 0 means d == 1).
struct FastDiv {
  uint32_t mul = 0;
  int shift = 0;
  FastDiv() = default;
  explicit FastDiv(int64_t d) {
    if (d <= 1) return;
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;  // ceil(log2(d))
    const int p = 31 + l;
    mul = static_cast<uint32_t>(((uint64_t{1} << p) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
    shift = p - 32;
  }
  __device__ __forceinline__ uint32_t Div(uint32_t n) const { return mul == 0 ? n : (__umulhi(n, mul) >> shift); }
};

// Calls f(T{}) with T the C++ type of a float dtype; false for other dtypes.
template <typename F>
inline bool DispatchFloatType(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32:
      f(float{});
      return true;
    case DType::kF16:
      f(__half{});
      return true;
    case DType::kBF16:
      f(__nv_bfloat16{});
      return true;
    default:
      return false;
  }
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline bool IsPow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
inline int64_t Pow2Ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Candidate {threads, unroll} configs of a flat elementwise kernel over
// `total` work units: `def` first, then the distinct ones `fits` accepts.
// Small problems try block sizes only; large ones also more loads per thread.
template <typename Config, typename Fits>
std::vector<Config> ThreadUnrollCandidates(const Config& def, int64_t total, Fits fits) {
  std::vector<Config> out = {def};
  auto add = [&](Config c) {
    if (!fits(c)) return;
    for (const Config& o : out) {
      if (o.threads == c.threads && o.unroll == c.unroll) return;
    }
    out.push_back(c);
  };
  if (total < 132 * 1024) {
    for (int t : {64, 128, 256, 512}) add({t, 1});
    add({128, 2});
  } else {
    for (int u : {1, 2, 4}) {
      for (int t : {128, 256, 512, 1024}) add({t, u});
    }
  }
  return out;
}

// 2^x on the special function unit (the softmax kernels' exp, pre-scaled by log2 e).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Sum of lens[0..b): the packed offset of sequence b of a varlen batch
// (warp-cooperative: every lane of the warp calls it and gets the sum).
__device__ __forceinline__ int SequenceStart(const int32_t* __restrict__ lens, int b) {
  int s = 0;
  for (int i = threadIdx.x & 31; i < b; i += 32) s += lens[i];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  return s;
}

}  // namespace fusedserve::cuda
