// Elementwise activations: silu_and_mul (SwiGLU) and gelu (erf, tanh).
//
// ActKernel<T, kN, kKind, kU>: a flat index over output vectors (kN elements:
// 16 bytes, or 1 on the scalar path); each thread issues the loads of its kU
// vectors (strided by blockDim for coalescing) before computing and storing,
// so a block keeps threads * kU * 16 bytes (twice that for silu_and_mul) in
// flight. silu_and_mul maps an output vector to its row with a
// multiply-shift division (FastDiv; no 64-bit divide per element). Bytes moved:
// silu_and_mul 3 * rows * cols * sizeof(T), gelu 2 * n * sizeof(T).
#include <algorithm>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/common.cuh"

namespace fusedserve::cuda {
namespace {

struct ActArgs {
  ActParams p;
  int64_t total;            // output vectors
  int64_t vpr;              // output vectors per row (silu_and_mul)
  FastDiv div_row;          // / vpr, for total < 2^31
  bool wide;                // total >= 2^31: plain 64-bit division
  int64_t prefetch_blocks;  // blocks [0, prefetch_blocks) prefetch their inputs (vector path)
};

__device__ __forceinline__ float Silu(float g) { return __fdividef(g, 1.0f + __expf(-g)); }
__device__ __forceinline__ float GeluErf(float v) { return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); }
__device__ __forceinline__ float GeluTanh(float v) {
  const float u = 0.79788456080286535588f * fmaf(0.044715f * v * v, v, v);
  return 0.5f * v * (1.0f + tanhf(u));
}

// Four vectors per thread (eight for silu_and_mul) need more than the 64
// registers a 1024-thread block leaves.
constexpr int ActMaxThreads(int unroll) { return unroll >= 4 ? 512 : 1024; }

template <typename T, int kN, ActKind kKind, int kU>
__global__ void __launch_bounds__(ActMaxThreads(kU)) ActKernel(const ActArgs a) {
  constexpr bool kSilu = kKind == ActKind::kSiluAndMul;
  const T* x = static_cast<const T*>(a.p.x);
  T* y = static_cast<T*>(a.p.y);
  const int64_t block_first = static_cast<int64_t>(blockIdx.x) * blockDim.x * kU;
  if constexpr (kN > 1) {
    if (blockIdx.x < a.prefetch_blocks && threadIdx.x == 0) {
      // This block's input bytes: one range for gelu; for silu_and_mul the
      // gate and up ranges of its row, or the whole span when it crosses rows.
      const int64_t last = min(a.total, block_first + static_cast<int64_t>(blockDim.x) * kU) - 1;
      constexpr int64_t kB = sizeof(T);
      if constexpr (kSilu) {
        const int64_t r0 = block_first / a.vpr, r1 = last / a.vpr;
        const int64_t c0 = block_first - r0 * a.vpr, c1 = last - r1 * a.vpr;
        const T* g0 = x + r0 * 2 * a.p.cols + c0 * kN;
        if (r0 == r1) {
          PrefetchL2(g0, (c1 - c0 + 1) * kN * kB);
          PrefetchL2(g0 + a.p.cols, (c1 - c0 + 1) * kN * kB);
        } else {
          PrefetchL2(g0, (x + r1 * 2 * a.p.cols + a.p.cols + (c1 + 1) * kN - g0) * kB);
        }
      } else {
        PrefetchL2(x + block_first * kN, (last - block_first + 1) * kN * kB);
      }
    }
  }
  PdlEnter();
  const int64_t base = block_first + threadIdx.x;
  Vec<T, kN> g[kU];
  Vec<T, kN> u[kSilu ? kU : 1];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t idx = base + static_cast<int64_t>(k) * blockDim.x;
    if (idx < a.total) {
      if constexpr (kSilu) {
        const int64_t row = a.wide ? idx / a.vpr : a.div_row.Div(static_cast<uint32_t>(idx));
        const int64_t col = idx - row * a.vpr;
        const T* gate = x + row * 2 * a.p.cols + col * kN;  // x[row, col*kN ...]
        g[k].Load(gate);
        u[k].Load(gate + a.p.cols);  // x[row, cols + col*kN ...]
      } else {
        g[k].Load(x + idx * kN);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t idx = base + static_cast<int64_t>(k) * blockDim.x;
    if (idx < a.total) {
      float f[kN];
      g[k].ToFloats(f);
      if constexpr (kSilu) {
        float h[kN];
        u[k].ToFloats(h);
#pragma unroll
        for (int i = 0; i < kN; ++i) f[i] = Silu(f[i]) * h[i];
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) f[i] = kKind == ActKind::kGeluTanh ? GeluTanh(f[i]) : GeluErf(f[i]);
      }
      Vec<T, kN> o;
      o.FromFloats(f);
      o.Store(y + idx * kN);
    }
  }
}

template <typename T, int kN, ActKind kKind>
CudaStatus LaunchUnroll(ActArgs a, const ActConfig& c, cudaStream_t stream) {
  const int64_t per_block = static_cast<int64_t>(c.threads) * c.unroll;
  const dim3 grid(static_cast<unsigned>(CeilDiv(a.total, per_block)));
  const dim3 block(static_cast<unsigned>(c.threads));
  a.prefetch_blocks = PrefetchBlocks(c.threads);
  switch (c.unroll) {
    case 1:
      return LaunchKernel(ActKernel<T, kN, kKind, 1>, grid, block, 0, stream, 1, a);
    case 2:
      return LaunchKernel(ActKernel<T, kN, kKind, 2>, grid, block, 0, stream, 1, a);
    default:
      return LaunchKernel(ActKernel<T, kN, kKind, 4>, grid, block, 0, stream, 1, a);
  }
}

template <typename T, int kN>
CudaStatus LaunchKind(const ActArgs& a, const ActConfig& c, cudaStream_t stream) {
  switch (a.p.kind) {
    case ActKind::kSiluAndMul:
      return LaunchUnroll<T, kN, ActKind::kSiluAndMul>(a, c, stream);
    case ActKind::kGeluErf:
      return LaunchUnroll<T, kN, ActKind::kGeluErf>(a, c, stream);
    case ActKind::kGeluTanh:
      return LaunchUnroll<T, kN, ActKind::kGeluTanh>(a, c, stream);
  }
  return CudaStatus::Error("LaunchActivation: unknown kind");
}

// Output vectors of a call: 16-byte vectors when the row length (silu) or the
// element count (gelu) allows, elements otherwise.
int64_t TotalVectors(ActKind kind, DType dtype, int64_t rows, int64_t cols, bool scalar) {
  const int vec = scalar ? 1 : static_cast<int>(16 / DTypeSize(dtype));
  return rows * cols / vec;
}

bool VectorOk(ActKind kind, DType dtype, int64_t rows, int64_t cols) {
  const int vec = static_cast<int>(16 / DTypeSize(dtype));
  return kind == ActKind::kSiluAndMul ? cols % vec == 0 : (rows * cols) % vec == 0;
}

bool Fits(const ActConfig& c, int64_t total) {
  if (c.threads < 32 || c.threads > 1024 || c.threads % 32 != 0) return false;
  if (c.unroll != 1 && c.unroll != 2 && c.unroll != 4) return false;
  if (c.threads > ActMaxThreads(c.unroll)) return false;
  return CeilDiv(total, static_cast<int64_t>(c.threads) * c.unroll) <= 0x7fffffff;
}

ActConfig DefaultFor(int64_t total) {
  // Enough vectors to give every SM of an H100 (132) 2048 threads: unroll
  // for more bytes in flight; fewer: one vector per thread, small blocks.
  constexpr int64_t kFull = 132 * 2048;
  if (total >= 4 * kFull) return {256, 4};
  if (total >= kFull) return {256, 2};
  if (total >= 132 * 256) return {256, 1};
  return {128, 1};
}

}  // namespace

std::string FormatActConfig(const ActConfig& c) {
  return "t" + std::to_string(c.threads) + ".u" + std::to_string(c.unroll);
}

bool ParseActConfig(const std::string& s, ActConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "tu", &v)) return false;
  *c = ActConfig{v[0], v[1]};
  return true;
}

ActConfig DefaultActConfig(ActKind kind, DType dtype, int64_t rows, int64_t cols) {
  return DefaultFor(TotalVectors(kind, dtype, rows, cols, !VectorOk(kind, dtype, rows, cols)));
}

std::vector<ActConfig> ActCandidates(ActKind kind, DType dtype, int64_t rows, int64_t cols) {
  const int64_t total = TotalVectors(kind, dtype, rows, cols, !VectorOk(kind, dtype, rows, cols));
  return ThreadUnrollCandidates(DefaultFor(total), total, [&](const ActConfig& c) { return Fits(c, total); });
}

CudaStatus LaunchActivation(const ActParams& p, const ActConfig& config, cudaStream_t stream) {
  if (p.rows <= 0 || p.cols <= 0) return CudaStatus::Ok();
  if (p.x == nullptr || p.y == nullptr) return CudaStatus::Error("LaunchActivation: missing tensor");
  const bool scalar = !VectorOk(p.kind, p.dtype, p.rows, p.cols) || !Aligned16(p.x) || !Aligned16(p.y);
  ActArgs a{};
  a.p = p;
  a.total = TotalVectors(p.kind, p.dtype, p.rows, p.cols, scalar);
  a.vpr = scalar ? p.cols : p.cols / static_cast<int64_t>(16 / DTypeSize(p.dtype));
  a.wide = a.total >= (int64_t{1} << 31);
  if (!a.wide) a.div_row = FastDiv(a.vpr);
  ActConfig c = config;
  if (!Fits(c, a.total)) c = DefaultFor(a.total);
  CudaStatus status = CudaStatus::Error("LaunchActivation: unsupported dtype");
  DispatchFloatType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = scalar ? LaunchKind<T, 1>(a, c, stream) : LaunchKind<T, kVec16<T>>(a, c, stream);
  });
  return status;
}

}  // namespace fusedserve::cuda
