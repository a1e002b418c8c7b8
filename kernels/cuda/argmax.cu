// Row argmax (see argmax.h): each row is cut into chunks, one CTA of 256
// threads per (chunk, row) with kU 16-byte loads in flight per thread; a
// CTA's best (value, index) goes to the workspace and the last CTA of a row
// to finish picks among its chunks' (no second kernel). The tie rule (larger
// value, then lower index) makes the result independent of the order in
// which threads and CTAs meet.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/argmax.h"
#include "kernels/cuda/common.cuh"

namespace fusedserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kU = 4;           // vectors in flight per thread
constexpr int kMaxChunks = 32;  // a warp merges a row's chunks

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

__device__ __forceinline__ Best WarpBest(Best b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    b = Pick(b, Best{__shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o)});
  }
  return b;
}

constexpr int kNone = 0x7fffffff;  // index of "no candidate" (a NaN value)

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    ArgmaxRowsKernel(const T* logits, int vocab, int chunk, Best* partial, unsigned* done, int32_t* out) {
  __shared__ Best warp_best[kThreads / 32];
  __shared__ bool last;
  PdlEnter();
  const int c = blockIdx.x, chunks = gridDim.x, row = blockIdx.y;
  const T* x = logits + static_cast<int64_t>(row) * vocab;
  const int end = min(vocab, (c + 1) * chunk);
  Best b{__int_as_float(0x7fc00000), kNone};  // NaN: beaten by any number
  for (int i0 = c * chunk + threadIdx.x * kN; i0 < end; i0 += kThreads * kN * kU) {
    Vec<T, kN> v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * kThreads * kN;
      if (i < end) v[u].Load(x + i);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int i = i0 + u * kThreads * kN;
      if (i >= end) break;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const float f = ToFloat(v[u].v[e]);
        if (Beats(f, i + e, b)) b = Best{f, i + e};
      }
    }
  }
  b = WarpBest(b);
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = b;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  b = WarpBest(threadIdx.x < kThreads / 32 ? warp_best[threadIdx.x] : Best{__int_as_float(0x7fc00000), kNone});
  if (chunks == 1) {
    // An all-NaN row gives index 0, as the host's scan does.
    if (threadIdx.x == 0) out[row] = b.i == kNone ? 0 : b.i;
    return;
  }
  if (threadIdx.x == 0) {
    partial[static_cast<int64_t>(row) * kMaxChunks + c] = b;
    last = LastBlockToFinish(done + row, chunks);
  }
  __syncwarp();
  if (!last) return;
  __threadfence();
  const Best* pr = partial + static_cast<int64_t>(row) * kMaxChunks;
  b = threadIdx.x < chunks ? Best{__ldcg(&pr[threadIdx.x].v), __ldcg(&pr[threadIdx.x].i)}
                           : Best{__int_as_float(0x7fc00000), kNone};
  b = WarpBest(b);
  if (threadIdx.x == 0) out[row] = b.i == kNone ? 0 : b.i;
}

}  // namespace

size_t ArgmaxWorkspaceBytes(int64_t rows) {
  return static_cast<size_t>(rows) * (kMaxChunks * sizeof(Best) + sizeof(unsigned));
}

CudaStatus LaunchArgmaxRows(DType dtype, const void* logits, int64_t rows, int64_t vocab, int32_t* out, void* workspace,
                            cudaStream_t stream) {
  if (rows <= 0) return CudaStatus::Ok();
  if (vocab <= 0 || vocab >= (int64_t{1} << 30)) return CudaStatus::Unsupported("argmax: bad vocab");
  if (rows > 65535) return CudaStatus::Unsupported("argmax: too many rows");
  Best* partial = static_cast<Best*>(workspace);
  unsigned* done = reinterpret_cast<unsigned*>(partial + rows * kMaxChunks);
  CudaStatus st = CudaStatus::Unsupported(std::string("argmax: unsupported dtype ") + DTypeName(dtype));
  DispatchFloatType(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kN = kVec16<T>;
    const T* x = static_cast<const T*>(logits);
    const bool vec = vocab % kN == 0 && Aligned16(x);
    // Chunks of whole passes (kThreads * kN * kU elements), at most kMaxChunks.
    const int64_t pass = static_cast<int64_t>(kThreads) * kN * kU;
    const int64_t passes = CeilDiv(vocab, pass);
    const int64_t chunks = std::min<int64_t>(kMaxChunks, workspace == nullptr ? 1 : passes);
    const int chunk = static_cast<int>(CeilDiv(passes, chunks) * pass);
    const dim3 grid(static_cast<unsigned>(CeilDiv(vocab, chunk)), static_cast<unsigned>(rows));
    const int v = static_cast<int>(vocab);
    st =
        vec ? LaunchKernel(ArgmaxRowsKernel<T, kN>, grid, dim3(kThreads), 0, stream, 1, x, v, chunk, partial, done, out)
            : LaunchKernel(ArgmaxRowsKernel<T, 1>, grid, dim3(kThreads), 0, stream, 1, x, v, chunk, partial, done, out);
  });
  return st;
}

}  // namespace fusedserve::cuda
