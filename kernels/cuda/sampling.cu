// Row argmax (see sampling.h): one CTA of 1024 threads per row, 16-byte
// loads when the row allows, a (value, index) reduction whose tie rule
// (larger value, then lower index) makes the result independent of the
// order in which threads meet.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.h"

namespace fusedserve::cuda {
namespace {

constexpr int kThreads = 1024;

struct Best {
  float v;
  int i;
};

// True when (v, i) beats b: NaN loses to everything, ties go to the lower index.
__device__ __forceinline__ bool Beats(float v, int i, const Best& b) {
  if (v != v) return false;
  if (b.v != b.v) return true;
  return v > b.v || (v == b.v && i < b.i);
}

__device__ __forceinline__ Best Pick(Best a, Best b) { return Beats(b.v, b.i, a) ? b : a; }

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads) ArgmaxRowsKernel(const T* logits, int vocab, int32_t* out) {
  __shared__ Best warp_best[kThreads / 32];
  PdlEnter();
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  Best b{__int_as_float(0x7fc00000), 0x7fffffff};  // NaN: beaten by any number
  // kU vectors in flight per thread: one CTA streams a 256 KB row, so the
  // loop is bound by load latency, not bandwidth.
  constexpr int kU = 4;
  for (int i0 = threadIdx.x * kN; i0 < vocab; i0 += kThreads * kN * kU) {
    Vec<T, kN> x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * kThreads * kN;
      if (i < vocab) x[u].Load(row + i);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * kThreads * kN;
      if (i >= vocab) break;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const float v = ToFloat(x[u].v[e]);
        if (Beats(v, i + e, b)) b = Best{v, i + e};
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    b = Pick(b, Best{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)});
  }
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = b;
  __syncthreads();
  if (threadIdx.x < 32) {
    b = warp_best[threadIdx.x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      b = Pick(b, Best{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)});
    }
    // An all-NaN row keeps index 0, as the host's max_element would.
    if (threadIdx.x == 0) out[blockIdx.x] = b.i == 0x7fffffff ? 0 : b.i;
  }
}

}  // namespace

CudaStatus LaunchArgmaxRows(DType dtype, const void* logits, int64_t rows, int64_t vocab, int32_t* out,
                            cudaStream_t stream) {
  if (rows <= 0) return CudaStatus::Ok();
  if (vocab <= 0 || vocab >= (int64_t{1} << 31) - kThreads * 32) return CudaStatus::Unsupported("argmax: bad vocab");
  if (rows > 65535 * 1024) return CudaStatus::Unsupported("argmax: too many rows");
  CudaStatus st = CudaStatus::Unsupported(std::string("argmax: unsupported dtype ") + DTypeName(dtype));
  DispatchFloatType(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kN = kVec16<T>;
    const T* x = static_cast<const T*>(logits);
    const bool vec = vocab % kN == 0 && Aligned16(x);
    const dim3 grid(static_cast<unsigned>(rows));
    const int v = static_cast<int>(vocab);
    st = vec ? LaunchKernel(ArgmaxRowsKernel<T, kN>, grid, dim3(kThreads), 0, stream, 1, x, v, out)
             : LaunchKernel(ArgmaxRowsKernel<T, 1>, grid, dim3(kThreads), 0, stream, 1, x, v, out);
  });
  return st;
}

}  // namespace fusedserve::cuda
