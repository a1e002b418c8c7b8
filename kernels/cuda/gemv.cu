// MLP helper kernels (see gemv.h).
//   v1 elementwise: activation in place, SwiGLU gate (silu(g) * u); 16-byte
//      vectors when sizes and alignment allow, else one element per thread.
//   v2 GEMV: a warp owns pairs of weight rows (linear: rows n, n+1; SwiGLU: gate
//      row j and up row j + I, so the activation is applied in registers and
//      the [M, 2I] intermediate never exists), streams them with 16-byte
//      evict-first loads, kUnroll vectors per row in flight per lane, and
//      reads x (tiny) through L1. Templated on dtype and an M tile (1,2,4,8).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/rope_kv_epilogue.cuh"

namespace fusedserve::cuda {
namespace {

using cuda::FromFloat;  // shared dtype conversions (common.cuh)
using cuda::ToFloat;

// 16 bytes of T as floats and back.
template <typename T>
struct Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  __device__ __forceinline__ static void Load(const uint4& u, float (&f)[kN]) {
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < kN; ++i) f[i] = ToFloat(e[i]);
  }
  __device__ __forceinline__ static uint4 Store(const float (&f)[kN]) {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < kN; ++i) e[i] = FromFloat<T>(f[i]);
    return u;
  }
};

__device__ __forceinline__ float Act(float x, Activation act) {
  switch (act) {
    case Activation::kSilu:
      return x / (1.0f + __expf(-x));
    case Activation::kGeluErf:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::kGeluTanh: {
      const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + tanhf(u));
    }
    default:
      return x;
  }
}
__device__ __forceinline__ float Silu(float x) { return x / (1.0f + __expf(-x)); }

int Blocks(int64_t work, int threads) {
  const int64_t b = (work + threads - 1) / threads;
  return static_cast<int>(b < 65536 * 8 ? (b < 1 ? 1 : b) : 65536 * 8);  // grid-stride loops cover the rest
}

template <typename T, bool kVector>
__global__ void ActivationKernel(T* __restrict__ y,  // [n]
                                 int64_t n, Activation act) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (kVector) {
    using V = Vec16<T>;
    uint4* yv = reinterpret_cast<uint4*>(y);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n / V::kN; i += stride) {
      float f[V::kN];
      V::Load(yv[i], f);
#pragma unroll
      for (int j = 0; j < V::kN; ++j) f[j] = Act(f[j], act);
      yv[i] = V::Store(f);
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
      y[i] = FromFloat<T>(Act(ToFloat(y[i]), act));
    }
  }
}

template <typename T>
__global__ void BiasActivationKernel(const T* __restrict__ bias,  // [N] or nullptr
                                     T* __restrict__ y,           // [M,N]
                                     int64_t M, int64_t N, Activation act) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * N; i += stride) {
    y[i] = FromFloat<T>(Act(bias ? ToFloat(bias[i % N]) : 0.0f, act));
  }
}

template <typename T, bool kVector>
__global__ void SiluAndMulKernel(const T* __restrict__ x,  // [M,2I]
                                 T* __restrict__ y,        // [M,I]
                                 int64_t M, int64_t I) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (kVector) {
    using V = Vec16<T>;
    const int64_t iv = I / V::kN;  // vectors per output row
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * iv; i += stride) {
      const int64_t m = i / iv, j = i - m * iv;
      const uint4* row = reinterpret_cast<const uint4*>(x + m * 2 * I);
      float g[V::kN], u[V::kN];
      V::Load(row[j], g);
      V::Load(row[iv + j], u);
#pragma unroll
      for (int e = 0; e < V::kN; ++e) g[e] = Silu(g[e]) * u[e];
      reinterpret_cast<uint4*>(y)[i] = V::Store(g);
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < M * I; i += stride) {
      const int64_t m = i / I, j = i - m * I;
      y[i] = FromFloat<T>(Silu(ToFloat(x[m * 2 * I + j])) * ToFloat(x[m * 2 * I + I + j]));
    }
  }
}

// ---- GEMV -------------------------------------------------------------------

constexpr int kGemvUnroll = 4;  // 16-byte vectors per weight row in flight per lane

// What a GEMV does around its dot products (the decode fusions, gemv.h).
enum GemvMode : int {
  kLinear = 0,    // y = act(acc + bias)
  kSwiglu = 1,    // y = silu(gate) * up
  kResidual = 2,  // y = acc + residual
  kRopeKv = 3,    // rope on q/k head rows, q/k/v to their buffers and the paged cache
};

struct GemvParams {
  const void* x;     // [M,K]
  const void* w;     // [N,K] (linear) or [2I,K] (SwiGLU)
  const void* bias;  // [N] or nullptr (linear only)
  void* y;           // [M,N] (linear) or [M,I] (SwiGLU); unused by kRopeKv
  int64_t M, N, K;   // SwiGLU: N = I
  Activation act;
  const void* residual;  // [M,N] (kResidual)
  const void* norm_w;    // [K] (kNorm): x is RMS-normalised with these weights
  float eps;
  GemvRopeKv rope;  // kRopeKv
  // The next RMS norm through the epilogues (GemvFusion::norm_next, sq_in).
  const void* norm_next;            // kResidual: [N] its weight; norm_out = y * norm_next
  void* norm_out;                   // [M,N]
  unsigned long long* sq_out;       // [M] rows' sums of y^2 (kSumScale fixed point), added to
  unsigned long long* sq_clear;     // [M] zeroed (the other producer's sums, read already)
  const unsigned long long* sq_in;  // a producer's sq_out: the sums scaled by rsqrt(sum / K + eps)
};

constexpr float kSumScale = kNormSumScale;

__device__ __forceinline__ uint4 LoadStream(const uint4* p) { return __ldcs(p); }

// Blocks an SM: as many as the registers allow without spills. Each row's x
// vectors of a chunk are held at once (16 registers a row), beside the
// weights' 32 and the epilogue operands: 80 registers at one row (6 blocks),
// rope 88 (5; at 80 it spilled), up to 128 at two rows (4), 168 at four (3).
// 8 rows (a tuning candidate only) and the folded norm: the compiler's
// choice (0).
template <int kM, int kMode, bool kNorm>
constexpr int GemvMinBlocks() {
  if (kNorm || kM > 4) return 0;
  if (kM == 1) return kMode == kRopeKv ? 5 : 6;
  return kM == 2 ? 4 : 3;
}

// Each warp owns one unit (a pair of weight rows, or a gate/up pair) at a
// time; with split > 1, `split` consecutive warps share a unit, each
// streaming every split-th 128-vector chunk of K, and add their partial sums
// through shared memory. Splitting is for small N (o_proj, down, qkv of a 1B
// model): one warp per unit left 8 warps per SM, too few bytes in flight to
// reach HBM bandwidth.
// kNorm: the RMS norm of x is folded in: the dot products use x * norm_w and
// are scaled by rsqrt(mean(x^2) + eps) at the end; the sum of squares comes
// from the x vectors the warps read anyway (first unit only), so no pass of
// its own (a prologue that normalised x first cost ~100 us per step).
template <typename T, int kM, int kMode, bool kNorm>
__global__ void __launch_bounds__(kGemvWarps * 32, (GemvMinBlocks<kM, kMode, kNorm>()))
    GemvKernel(GemvParams p, int64_t units_per_warp, int split) {
  using V = Vec16<T>;
  constexpr bool kSw = kMode == kSwiglu;
  constexpr int kAcc = kNorm ? 3 : 2;
  __shared__ float partial[kGemvWarps][kM][kAcc];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int slice = warp % split;
  const int64_t units = kSw ? p.N : (p.N + 1) / 2;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * (kGemvWarps / split) + warp / split) * units_per_warp;
  // Vector offsets fit 32 bits (GemvShape bounds K): 64-bit index math and
  // bounds checks were a third more instructions than a bare weight stream.
  const int nvec = static_cast<int>(p.K / V::kN);
  const int base0 = lane + slice * 32 * kGemvUnroll;  // this lane's first vector of a row
  const int step = 32 * kGemvUnroll * split;          // vectors between a warp's chunks
  // The two weight rows of a unit (the second may not exist: r1 == N).
  auto rows_of = [&](int64_t unit, const uint4*& w0, const uint4*& w1) {
    const int64_t r0 = kSw ? unit : 2 * unit;
    const int64_t r1 = kSw ? unit + p.N : 2 * unit + 1;
    w0 = reinterpret_cast<const uint4*>(static_cast<const T*>(p.w) + r0 * p.K);
    w1 = reinterpret_cast<const uint4*>(static_cast<const T*>(p.w) + (kSw || r1 < p.N ? r1 : r0) * p.K);
  };
  uint4 a[kGemvUnroll], b[kGemvUnroll];
  // A chunk's weights: w0 and w1 point at this lane's first vector of it,
  // `left` vectors remain in the row from there. kGuard: the chunk may run
  // past K (the row's last, partial chunk); a full chunk loads and
  // multiplies without per-vector checks.
  auto load = [&](const uint4* w0, const uint4* w1, int left, auto guard) {
    constexpr bool kGuard = decltype(guard)::value;
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      if (!kGuard || 32 * u < left) {
        a[u] = LoadStream(w0 + 32 * u);
        b[u] = LoadStream(w1 + 32 * u);
      }
    }
  };
  // The weights never depend on the previous kernel: the first chunk goes
  // out before the programmatic-dependent-launch wait, so its HBM round trip
  // overlaps the previous kernel's tail. Then wait for the previous kernel's
  // writes (x) and let the next kernel start launching.
  if (first < units) {
    const uint4 *w0, *w1;
    rows_of(first, w0, w1);
    load(w0 + base0, w1 + base0, nvec - base0, std::true_type{});
  }
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const uint4* xv = reinterpret_cast<const uint4*>(p.x);
  const uint4* gv = reinterpret_cast<const uint4*>(p.norm_w);
  T* y = static_cast<T*>(p.y);
  float rstd[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) rstd[m] = 1.0f;
  // A producer's sums (kernel complete: after the wait), lane m row m's;
  // turned into rstd at the first epilogue, so the load's latency hides
  // under the weight stream.
  unsigned long long sq_row = 0;
  if constexpr (!kNorm) {
    if (p.sq_in != nullptr && lane < kM && lane < p.M) sq_row = __ldcg(p.sq_in + lane);
  }
  float sumsq = 0.0f;  // kResidual with norm_out: lane m's row's sum of the stored y^2
  // The same trip count for every warp of the block (the split barrier).
  for (int64_t k = 0; k < units_per_warp; ++k) {
    const int64_t unit = first + k;
    const bool live = unit < units;
    // The two weight rows of this unit and whether the second exists.
    const int64_t r0 = kSw ? unit : 2 * unit;
    const int64_t r1 = kSw ? unit + p.N : 2 * unit + 1;
    const bool has1 = kSw || r1 < p.N;
    // The epilogue's operands for this lane's row (lane m writes row m), loaded
    // now so their L2 round trip hides under the weight stream instead of
    // adding to the kernel's tail: the residual pair, or rope's (cos, sin)
    // and the cache slot.
    float res0 = 0.0f, res1 = 0.0f, g0 = 0.0f, g1 = 0.0f;
    float2 cs = make_float2(1.0f, 0.0f);
    int64_t slot = -1;
    if (live && slice == 0 && lane < kM && lane < p.M) {
      if constexpr (kMode == kResidual) {
        const T* res = static_cast<const T*>(p.residual) + lane * p.N;
        res0 = ToFloat(res[r0]);
        if (has1) res1 = ToFloat(res[r1]);
        if (p.norm_out != nullptr) {
          const T* g = static_cast<const T*>(p.norm_next);
          g0 = ToFloat(g[r0]);
          if (has1) g1 = ToFloat(g[r1]);
        }
      } else if constexpr (kMode == kRopeKv) {
        cs = RopeKvCosSin(p.rope, r0, p.rope.positions[lane]);
        if (p.rope.slots != nullptr) slot = p.rope.slots[lane];
      }
    }

    float acc[kM][kAcc];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) acc[m][j] = 0.0f;
    }

    // One chunk: this lane's kGemvUnroll vectors of the two rows, times x
    // (and the folded norm's weights), into acc. The pointers are at the
    // lane's first vector of the chunk (x: of row 0), as in load.
    auto chunk = [&](const uint4* w0, const uint4* w1, const uint4* x, const uint4* g, int left, bool loaded,
                     auto guard) {
      constexpr bool kGuard = decltype(guard)::value;
      if (!loaded) load(w0, w1, left, guard);
      // The chunk's x vectors of every row (and the norm weights) are
      // loaded together, before any math: issued one by one behind each
      // vector's bounds branch, they were four serial L1/L2 round trips a
      // chunk and row (H200, one-row down [2048, 8192] in a graph: 13.2 us
      // against 9.6 for the same weight stream with x loaded up front).
      [[maybe_unused]] uint4 gr[kGemvUnroll];  // kNorm only
      if constexpr (kNorm) {
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
          gr[u] = !kGuard || 32 * u < left ? __ldg(g + 32 * u) : make_uint4(0, 0, 0, 0);
        }
      }
      uint4 xr[kM][kGemvUnroll];
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int u = 0; u < kGemvUnroll; ++u) {
          // M >= 1: row 0 always exists.
          xr[m][u] = (!kGuard || 32 * u < left) && (m == 0 || m < p.M) ? __ldg(x + (m * nvec + 32 * u))
                                                                       : make_uint4(0, 0, 0, 0);
        }
      }
      // Vector by vector, each row's dot products: a vector's weights are
      // converted once for all rows (each accumulator still adds in K order).
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        if (kGuard && 32 * u >= left) continue;
        float fa[V::kN], fb[V::kN];
        V::Load(a[u], fa);
        V::Load(b[u], fb);
        [[maybe_unused]] float fg[V::kN];
        if constexpr (kNorm) V::Load(gr[u], fg);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if (m > 0 && m >= p.M) continue;
          float fx[V::kN];
          V::Load(xr[m][u], fx);
          if constexpr (kNorm) {
            if (k == 0) {
#pragma unroll
              for (int e = 0; e < V::kN; ++e) acc[m][2] = fmaf(fx[e], fx[e], acc[m][2]);
            }
#pragma unroll
            for (int e = 0; e < V::kN; ++e) fx[e] *= fg[e];
          }
#pragma unroll
          for (int e = 0; e < V::kN; ++e) {
            acc[m][0] = fmaf(fa[e], fx[e], acc[m][0]);
            acc[m][1] = fmaf(fb[e], fx[e], acc[m][1]);
          }
        }
      }
    };
    if (live) {
      const uint4 *w0, *w1;
      rows_of(unit, w0, w1);
      // The pointers advance with the chunks (the compiler recomputed the
      // rows' 64-bit addresses for every chunk from offsets).
      w0 += base0;
      w1 += base0;
      const uint4* x = xv + base0;
      const uint4* g = kNorm ? gv + base0 : nullptr;
      for (int left = nvec - base0; left > 0; left -= step) {
        const bool loaded = k == 0 && left == nvec - base0;  // loaded before the wait
        if (left > 32 * (kGemvUnroll - 1)) {
          chunk(w0, w1, x, g, left, loaded, std::false_type{});
        } else {
          chunk(w0, w1, x, g, left, loaded, std::true_type{});
        }
        w0 += step;
        w1 += step;
        x += step;
        if constexpr (kNorm) g += step;
      }
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int j = 0; j < kAcc; ++j) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc[m][j] += __shfl_xor_sync(0xffffffffu, acc[m][j], off);
      }
    }
    if (split > 1) {
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < kM; ++m) {
#pragma unroll
          for (int j = 0; j < kAcc; ++j) partial[warp][m][j] = acc[m][j];
        }
      }
      __syncthreads();
      if (slice == 0) {
        for (int s = 1; s < split; ++s) {
#pragma unroll
          for (int m = 0; m < kM; ++m) {
#pragma unroll
            for (int j = 0; j < kAcc; ++j) acc[m][j] += partial[warp + s][m][j];
          }
        }
      }
      __syncthreads();
    }
    if (!live || slice != 0) continue;
    if constexpr (!kNorm) {
      if (p.sq_in != nullptr && k == 0) {
        const float r = rsqrtf(static_cast<float>(sq_row) / kSumScale / static_cast<float>(p.K) + p.eps);
#pragma unroll
        for (int m = 0; m < kM; ++m) rstd[m] = r;  // lane m uses rstd[m] only
      }
    }
    if constexpr (kNorm) {
      if (k == 0) {
#pragma unroll
        for (int m = 0; m < kM; ++m) rstd[m] = rsqrtf(acc[m][2] / static_cast<float>(p.K) + p.eps);
      }
    }
    // Lane m writes row m's outputs.
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (lane == m && m < p.M) {
        const float v0 = acc[m][0] * rstd[m], v1 = acc[m][1] * rstd[m];
        if constexpr (kSw) {
          y[m * p.N + unit] = FromFloat<T>(Silu(v0) * v1);
        } else if constexpr (kMode == kResidual) {
          const T o0 = FromFloat<T>(v0 + res0), o1 = FromFloat<T>(v1 + res1);
          y[m * p.N + r0] = o0;
          if (has1) y[m * p.N + r1] = o1;
          if (p.norm_out != nullptr) {  // the norm of the values as stored
            T* z = static_cast<T*>(p.norm_out) + m * p.N;
            const float a0 = ToFloat(o0), a1 = has1 ? ToFloat(o1) : 0.0f;
            z[r0] = FromFloat<T>(a0 * g0);
            if (has1) z[r1] = FromFloat<T>(a1 * g1);
            sumsq = fmaf(a0, a0, fmaf(a1, a1, sumsq));
          }
        } else if constexpr (kMode == kRopeKv) {
          RopeKvStorePair<T>(p.rope, v0, v1, r0, m, cs, slot);  // rows r0, r0 + 1: a rotation pair (or two v elements)
        } else {
          const T* bias = static_cast<const T*>(p.bias);
          y[m * p.N + r0] = FromFloat<T>(Act(v0 + (bias ? ToFloat(bias[r0]) : 0.0f), p.act));
          if (has1) y[m * p.N + r1] = FromFloat<T>(Act(v1 + (bias ? ToFloat(bias[r1]) : 0.0f), p.act));
        }
      }
    }
  }
  if constexpr (kMode == kResidual) {
    if (p.sq_out != nullptr) {  // this block's rows' sums of y^2 (lane m holds row m's)
      if (lane < kM) partial[warp][lane][0] = sumsq;
      __syncthreads();
      if (threadIdx.x < kM && threadIdx.x < p.M) {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < kGemvWarps; ++w) t += partial[w][threadIdx.x][0];
        atomicAdd(p.sq_out + threadIdx.x, static_cast<unsigned long long>(__float2ull_rn(t * kSumScale)));
        if (blockIdx.x == 0) p.sq_clear[threadIdx.x] = 0;
      }
    }
  }
}

}  // namespace

GemvGrid PlanGemvGrid(int64_t units, int64_t resident_warps) {
  GemvGrid g;
  while (g.split < kGemvWarps && units * g.split * 2 <= resident_warps) g.split *= 2;
  const int64_t unit_slots = resident_warps / g.split;  // warp groups resident at once
  g.units_per_warp = (units + unit_slots - 1) / unit_slots;
  g.groups = (units + g.units_per_warp - 1) / g.units_per_warp;
  const int64_t groups_per_block = kGemvWarps / g.split;
  g.blocks = (g.groups + groups_per_block - 1) / groups_per_block;
  return g;
}

bool GemvTakesCappedGrid(const GemvGrid& natural, const GemvGrid& capped) {
  return 3 * capped.Warps() >= 2 * natural.Warps();
}

namespace {

// Blocks an SM may hold of a GEMV (one row: registers allow 5-6). Measured on
// the H200 (bench/gpu_gemv_stream_bench, bench/notes/decode_fusion.md,
// sixteenth session): the same grid of one-row blocks streams faster when an
// SM may hold at most 4 of them (llama-3-8b down [4096, 14336] 28.9 us
// against 35.2, o_proj [4096, 4096] 9.9 / 11.5, the 1B down 10.0 / 11.3).
// The blocks spread over the SMs alike either way (3-4 each, counted by
// %smid), and the cap is set through dynamic shared memory although a full
// shared-memory carveout without a cap makes the GEMV slower (down 35.2 ->
// 38.5 us). The mechanism is not known; the cap is kept where the numbers
// support it. FUSEDSERVE_GEMV_SM_BLOCKS=n (0-8, read once; 0: no cap)
// overrides it for A/B runs.
constexpr int kGemvSmBlocksCap = 4;
int GemvSmBlocksCap() {
  static const int cap = EnvKnob("FUSEDSERVE_GEMV_SM_BLOCKS", 0, 8, kGemvSmBlocksCap);
  return cap;
}

// Launched as a programmatic dependent of the previous kernel (unless
// FUSEDSERVE_PDL=0): its weight loads start during that kernel's tail.
template <typename T, int kMode, bool kNorm>
CudaStatus LaunchGemvT(const GemvParams& p, cudaStream_t stream) {
  constexpr bool kSw = kMode == kSwiglu;
  auto kernel = p.M <= 1   ? GemvKernel<T, 1, kMode, kNorm>
                : p.M <= 2 ? GemvKernel<T, 2, kMode, kNorm>
                : p.M <= 4 ? GemvKernel<T, 4, kMode, kNorm>
                           : GemvKernel<T, 8, kMode, kNorm>;
  constexpr int kThreads = kGemvWarps * 32;
  const int64_t units = kSw ? p.N : (p.N + 1) / 2;
  int64_t resident_blocks = 0;
  if (CudaStatus s = cuda::ResidentBlocks(kernel, kThreads, &resident_blocks); !s.ok()) return s;
  GemvGrid grid = PlanGemvGrid(units, resident_blocks * kGemvWarps);
  // The block cap (above), where GemvTakesCappedGrid.
  size_t smem = 0;
  if (const int cap = GemvSmBlocksCap(); cap > 0) {
    size_t cap_smem = 0;
    if (CudaStatus s = cuda::SharedMemoryForBlockCap(cap, &cap_smem); !s.ok()) return s;
    int64_t capped_blocks = 0;
    if (cap_smem > 0) {
      if (CudaStatus s = cuda::ResidentBlocks(kernel, kThreads, &capped_blocks, cap_smem); !s.ok()) return s;
    }
    if (capped_blocks > 0 && capped_blocks < resident_blocks) {
      const GemvGrid capped = PlanGemvGrid(units, capped_blocks * kGemvWarps);
      if (GemvTakesCappedGrid(grid, capped)) {
        grid = capped;
        smem = cap_smem;
      }
    }
  }
  if (grid.blocks > 0x7fffffff) return CudaStatus::Error("GEMV: N too large");
  return cuda::LaunchKernel(kernel, dim3(static_cast<unsigned>(grid.blocks)), dim3(kThreads), smem, stream, 1, p,
                            grid.units_per_warp, grid.split);
}

template <bool kSw>
CudaStatus LaunchGemvDtype(DType dtype, const GemvParams& p, cudaStream_t stream) {
  constexpr int kMode = kSw ? kSwiglu : kLinear;
  switch (dtype) {
    case DType::kBF16:
      return LaunchGemvT<__nv_bfloat16, kMode, false>(p, stream);
    case DType::kF16:
      return LaunchGemvT<__half, kMode, false>(p, stream);
    case DType::kF32:
      return LaunchGemvT<float, kMode, false>(p, stream);
    default:
      return CudaStatus::Error("GEMV: unsupported dtype");
  }
}

// The fused variants: 16-bit dtypes only (the model dtypes that decode runs in).
template <int kMode, bool kNorm>
CudaStatus LaunchGemvFusedDtype(DType dtype, const GemvParams& p, cudaStream_t stream) {
  switch (dtype) {
    case DType::kBF16:
      return LaunchGemvT<__nv_bfloat16, kMode, kNorm>(p, stream);
    case DType::kF16:
      return LaunchGemvT<__half, kMode, kNorm>(p, stream);
    default:
      return CudaStatus::Unsupported("fused GEMV: bf16 and fp16 only");
  }
}

}  // namespace

CudaStatus LaunchActivationInPlace(DType dtype, int64_t n, Activation act, void* y, cudaStream_t stream) {
  if (act == Activation::kNone || n == 0) return CudaStatus::Ok();
  constexpr int kThreads = 256;
  const bool vec = Aligned16(y) && n % (16 / DTypeSize(dtype)) == 0;
  const int64_t work = vec ? n / (16 / DTypeSize(dtype)) : n;
  const int blocks = Blocks(work, kThreads);
  switch (dtype) {
    case DType::kBF16:
      if (vec)
        ActivationKernel<__nv_bfloat16, true><<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(y), n, act);
      else
        ActivationKernel<__nv_bfloat16, false><<<blocks, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(y), n, act);
      break;
    case DType::kF16:
      if (vec)
        ActivationKernel<__half, true><<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(y), n, act);
      else
        ActivationKernel<__half, false><<<blocks, kThreads, 0, stream>>>(static_cast<__half*>(y), n, act);
      break;
    case DType::kF32:
      if (vec)
        ActivationKernel<float, true><<<blocks, kThreads, 0, stream>>>(static_cast<float*>(y), n, act);
      else
        ActivationKernel<float, false><<<blocks, kThreads, 0, stream>>>(static_cast<float*>(y), n, act);
      break;
    default:
      return CudaStatus::Error("activation: unsupported dtype");
  }
  return FS_CUDA_CHECK_LAUNCH();
}

CudaStatus LaunchBiasActivation(DType dtype, int64_t M, int64_t N, const void* bias, Activation act, void* y,
                                cudaStream_t stream) {
  if (M * N == 0) return CudaStatus::Ok();
  constexpr int kThreads = 256;
  const int blocks = Blocks(M * N, kThreads);
  switch (dtype) {
    case DType::kBF16:
      BiasActivationKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(bias),
                                                            static_cast<__nv_bfloat16*>(y), M, N, act);
      break;
    case DType::kF16:
      BiasActivationKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(bias), static_cast<__half*>(y),
                                                            M, N, act);
      break;
    case DType::kF32:
      BiasActivationKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(bias), static_cast<float*>(y), M,
                                                            N, act);
      break;
    default:
      return CudaStatus::Error("bias activation: unsupported dtype");
  }
  return FS_CUDA_CHECK_LAUNCH();
}

CudaStatus LaunchMlpSiluAndMul(DType dtype, int64_t M, int64_t I, const void* x, void* y, cudaStream_t stream) {
  if (M * I == 0) return CudaStatus::Ok();
  constexpr int kThreads = 256;
  const int64_t vn = 16 / DTypeSize(dtype);
  const bool vec = Aligned16(x) && Aligned16(y) && I % vn == 0;
  const int blocks = Blocks(vec ? M * I / vn : M * I, kThreads);
  switch (dtype) {
    case DType::kBF16: {
      auto* xs = static_cast<const __nv_bfloat16*>(x);
      auto* ys = static_cast<__nv_bfloat16*>(y);
      if (vec)
        SiluAndMulKernel<__nv_bfloat16, true><<<blocks, kThreads, 0, stream>>>(xs, ys, M, I);
      else
        SiluAndMulKernel<__nv_bfloat16, false><<<blocks, kThreads, 0, stream>>>(xs, ys, M, I);
      break;
    }
    case DType::kF16: {
      auto* xs = static_cast<const __half*>(x);
      auto* ys = static_cast<__half*>(y);
      if (vec)
        SiluAndMulKernel<__half, true><<<blocks, kThreads, 0, stream>>>(xs, ys, M, I);
      else
        SiluAndMulKernel<__half, false><<<blocks, kThreads, 0, stream>>>(xs, ys, M, I);
      break;
    }
    case DType::kF32: {
      auto* xs = static_cast<const float*>(x);
      auto* ys = static_cast<float*>(y);
      if (vec)
        SiluAndMulKernel<float, true><<<blocks, kThreads, 0, stream>>>(xs, ys, M, I);
      else
        SiluAndMulKernel<float, false><<<blocks, kThreads, 0, stream>>>(xs, ys, M, I);
      break;
    }
    default:
      return CudaStatus::Error("silu_and_mul: unsupported dtype");
  }
  return FS_CUDA_CHECK_LAUNCH();
}

bool GemvShape(DType dtype, int64_t M, int64_t K) {
  // K bounded so that the kernel's vector offsets (m * K / vector + i) fit 32 bits.
  if (!IsFloat(dtype) || M < 1 || M > kGemvMaxM || K < 1 || K > (int64_t{1} << 26)) return false;
  return K % static_cast<int64_t>(16 / DTypeSize(dtype)) == 0;
}

bool GemvSupported(DType dtype, int64_t M, int64_t K, const void* x, const void* w) {
  return GemvShape(dtype, M, K) && Aligned16(x) && Aligned16(w);
}

CudaStatus LaunchGemv(const GemmParams& g, cudaStream_t stream) {
  if (!GemvSupported(g.dtype, g.M, g.K, g.x, g.w)) return CudaStatus::Error("GEMV: unsupported problem");
  if (g.N == 0) return CudaStatus::Ok();
  GemvParams p{};
  p.x = g.x;
  p.w = g.w;
  p.bias = g.bias;
  p.y = g.y;
  p.M = g.M;
  p.N = g.N;
  p.K = g.K;
  p.act = g.act;
  return LaunchGemvDtype<false>(g.dtype, p, stream);
}

CudaStatus LaunchGemvSwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                            cudaStream_t stream) {
  if (!GemvSupported(dtype, M, D, x, gate_up)) return CudaStatus::Error("GEMV SwiGLU: unsupported problem");
  if (I == 0) return CudaStatus::Ok();
  GemvParams p{};
  p.x = x;
  p.w = gate_up;
  p.y = h;
  p.M = M;
  p.N = I;
  p.K = D;
  p.act = Activation::kNone;
  return LaunchGemvDtype<true>(dtype, p, stream);
}

CudaStatus LaunchGemvFused(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                           const GemvFusion& f, cudaStream_t stream) {
  if (!GemvSupported(dtype, M, K, x, w)) return CudaStatus::Unsupported("fused GEMV: unsupported problem");
  if (f.norm_weight != nullptr && !Aligned16(f.norm_weight))
    return CudaStatus::Unsupported("fused GEMV: norm weight not 16-byte aligned");
  if (N == 0) return CudaStatus::Ok();
  GemvParams p{};
  p.x = x;
  p.w = w;
  p.y = y;
  p.M = M;
  p.N = N;
  p.K = K;
  p.act = Activation::kNone;
  p.residual = f.residual;
  p.norm_w = f.norm_weight;
  p.eps = f.eps;
  p.rope = f.rope;
  p.norm_next = f.norm_next;
  p.norm_out = f.norm_out;
  p.sq_out = f.sq_out;
  p.sq_clear = f.sq_clear;
  p.sq_in = f.sq_in;
  const bool norm = f.norm_weight != nullptr;
  if (norm && f.sq_in != nullptr) return CudaStatus::Unsupported("fused GEMV: norm weight and producer sums");
  if (!f.NormNextConsistent())
    return CudaStatus::Error("fused GEMV: norm_next, norm_out, sq_out and sq_clear go together");
  if (!f.EpiloguesCombine())
    return CudaStatus::Unsupported("fused GEMV: the next norm's epilogue needs the residual add, rope excludes it");
  if (f.rope_kv) {
    const GemvRopeKv& r = f.rope;
    if (!r.ShapeFits(N, 2)) return CudaStatus::Unsupported("fused GEMV: rope epilogue shape");
    if (!r.TensorsPresent()) return CudaStatus::Error("fused GEMV: rope epilogue tensor missing");
    return norm ? LaunchGemvFusedDtype<kRopeKv, true>(dtype, p, stream)
                : LaunchGemvFusedDtype<kRopeKv, false>(dtype, p, stream);
  }
  if (y == nullptr) return CudaStatus::Error("fused GEMV: no output");
  if (f.residual != nullptr) {
    if (norm) return CudaStatus::Unsupported("fused GEMV: norm with residual");
    return LaunchGemvFusedDtype<kResidual, false>(dtype, p, stream);
  }
  return norm ? LaunchGemvFusedDtype<kLinear, true>(dtype, p, stream)
              : LaunchGemvFusedDtype<kLinear, false>(dtype, p, stream);
}

CudaStatus LaunchGemvSwigluFused(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                 void* h, const GemvFusion& f, cudaStream_t stream) {
  if (!GemvSupported(dtype, M, D, x, gate_up) || (f.norm_weight != nullptr && !Aligned16(f.norm_weight)))
    return CudaStatus::Unsupported("GEMV SwiGLU fused: unsupported problem");
  if (f.residual != nullptr || f.rope_kv || f.norm_out != nullptr || (f.norm_weight != nullptr && f.sq_in != nullptr))
    return CudaStatus::Unsupported("GEMV SwiGLU fused: only a folded norm or a producer's sums");
  if (I == 0) return CudaStatus::Ok();
  GemvParams p{};
  p.x = x;
  p.w = gate_up;
  p.y = h;
  p.M = M;
  p.N = I;
  p.K = D;
  p.act = Activation::kNone;
  p.norm_w = f.norm_weight;
  p.eps = f.eps;
  p.sq_in = f.sq_in;
  return f.norm_weight != nullptr ? LaunchGemvFusedDtype<kSwiglu, true>(dtype, p, stream)
                                  : LaunchGemvFusedDtype<kSwiglu, false>(dtype, p, stream);
}

}  // namespace fusedserve::cuda
