// The one-sequence decode megakernel (see decode_megakernel.h).
//
// Grid: one CTA of 16 warps per SM, launched cooperatively (every CTA
// resident, as the grid barrier needs). Work of a GEMV stage is spread over
// all warps of the grid (PlanStage: a unit is a pair of weight rows, as in
// gemv.cu: a rotation pair of QKV, a gate/up pair of the SwiGLU; with fewer
// units than warps, 2-4 warps split a unit's K), streaming its rows with
// 16-byte evict-first loads against the stage's input row, which every CTA
// holds in shared memory as fp32 (normalised there when the stage starts
// with an RMS norm). The attention of the one query row takes one CTA per
// (kv head, context split): its warps split the keys, each keeps an online
// softmax for the kv head's query heads, the CTA merges them through shared
// memory and the last split of a kv head merges the splits. Rows that pass
// between stages (q, the attention output, the SwiGLU activation) stay fp32
// in the workspace; the residual row x is updated in place in the model
// dtype, as the unfused kernels store it. Data written by other CTAs in an
// earlier stage (x, those rows, the new token's cache row) is read through
// L2 (__ldcg): L1 is not coherent across SMs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_megakernel.h"

namespace fusedserve::cuda {
namespace {

constexpr int kWarps = 16;
// 16-byte vectors of each weight row in flight per lane in a GEMV stage
// (eight spilled at the 128 registers a thread of one 16-warp CTA an SM).
constexpr int kRowUnroll = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;
// The workspace: the barrier's counter and generation, at kDoneAt the
// attention's finished-split counters (one per kv head), then fp32 rows.
constexpr size_t kSyncBytes = 1024;
constexpr int kDoneAt = 32;
constexpr int kMaxKvHeads = static_cast<int>(kSyncBytes / sizeof(unsigned)) - kDoneAt;

template <typename T>
__device__ __forceinline__ void Unpack8(const uint4& u, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = ToFloat(e[i]);
}

__device__ __forceinline__ unsigned LoadAcquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every CTA of the grid arrives before any leaves; the writes of all CTAs
// before it are visible to all after it. count returns to zero each time and
// gen counts the barriers passed; thread 0 of each CTA keeps the generation
// it waits for in `target` (gen at the launch's start, read once: no CTA can
// pass the first barrier before every CTA has read it), which saves an L2
// round trip a barrier against reading gen on arrival.
__device__ __forceinline__ void GridBarrier(unsigned* count, unsigned* gen, unsigned& target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    ++target;
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      atomicExch(count, 0u);
      __threadfence();
      atomicAdd(gen, 1u);
    } else {
      while (static_cast<int>(LoadAcquire(gen) - target) < 0) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// xs[i] = x[i] (fp32), and with a norm weight xs[i] = x[i] * rstd * w[i],
// rstd = rsqrt(mean(x^2) + eps). x: n <= kMaxRow elements written by other
// CTAs (read through L2), n a multiple of 8. Ends with __syncthreads.
constexpr int kMaxRow = 16384;
template <typename X, typename T>
__device__ void LoadRow(const X* x, const T* norm_w, int n, float eps, float* xs, float* red) {
  float ss = 0.0f;
  for (int i = threadIdx.x * 8; i < n; i += kThreads * 8) {
    float f[8];
    if constexpr (sizeof(X) == 4) {
      const float4 a = __ldcg(reinterpret_cast<const float4*>(x + i));
      const float4 b = __ldcg(reinterpret_cast<const float4*>(x + i + 4));
      f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    } else {
      Unpack8<X>(__ldcg(reinterpret_cast<const uint4*>(x + i)), f);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      xs[i + e] = f[e];
      ss = fmaf(f[e], f[e], ss);
    }
  }
  if (norm_w == nullptr) {
    __syncthreads();
    return;
  }
  ss = GroupReduce(ss, SumOp{}, 32);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += red[w];
  const float rstd = rsqrtf(total / static_cast<float>(n) + eps);
  for (int i = threadIdx.x * 8; i < n; i += kThreads * 8) {
    float w[8];
    Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(norm_w + i)), w);
#pragma unroll
    for (int e = 0; e < 8; ++e) xs[i + e] = xs[i + e] * rstd * w[e];
  }
  __syncthreads();  // also: red is free for the next call
}

// How a GEMV stage of `units` units spreads over the grid's warps: when there
// are too few units, `parts` (2 or 4) consecutive warps of a CTA split a
// unit's K; warp group g takes units g, g + groups, ... (iters rounds, the
// same in every warp of a CTA).
struct StagePlan {
  int parts, part, group, groups, iters;
};
__device__ __forceinline__ StagePlan PlanStage(int units) {
  const int warp = threadIdx.x >> 5, nw = gridDim.x * kWarps;
  StagePlan sp;
  sp.parts = 1;
  while (sp.parts < 4 && units * sp.parts * 2 <= nw) sp.parts *= 2;
  const int per_cta = kWarps / sp.parts;
  sp.group = blockIdx.x * per_cta + warp / sp.parts;
  sp.groups = gridDim.x * per_cta;
  sp.part = warp % sp.parts;
  sp.iters = (units + sp.groups - 1) / sp.groups;
  return sp;
}

// This warp's part of (w0 . xs, w1 . xs) over K elements (K a multiple of
// 8), in every lane: of the 16-byte vectors, lane l takes l + 32 (part +
// parts k) for k = 0, 1, ..., kRowUnroll of them per row in flight.
template <typename T>
__device__ __forceinline__ float2 DotPair(const T* w0, const T* w1, const float* xs, int K, int part, int parts) {
  const int lane = threadIdx.x & 31;
  const int nvec = K / 8;
  const uint4* a = reinterpret_cast<const uint4*>(w0);
  const uint4* b = reinterpret_cast<const uint4*>(w1);
  const int step = 32 * parts;
  float s0 = 0.0f, s1 = 0.0f;
  for (int base = lane + 32 * part; base < nvec; base += step * kRowUnroll) {
    uint4 ra[kRowUnroll], rb[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int i = base + step * u;
      if (i < nvec) {
        ra[u] = __ldcs(a + i);
        rb[u] = __ldcs(b + i);
      }
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int i = base + step * u;
      if (i < nvec) {
        const float4 x0 = *reinterpret_cast<const float4*>(xs + 8 * i);
        const float4 x1 = *reinterpret_cast<const float4*>(xs + 8 * i + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float fa[8], fb[8];
        Unpack8<T>(ra[u], fa);
        Unpack8<T>(rb[u], fb);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          s0 = fmaf(fa[e], xv[e], s0);
          s1 = fmaf(fb[e], xv[e], s1);
        }
      }
    }
  }
  return make_float2(GroupReduce(s0, SumOp{}, 32), GroupReduce(s1, SumOp{}, 32));
}

// The GEMV stage's weights as units: unit u is rows u * row_step and
// u * row_step + row_off of w (K columns each).
template <typename T>
struct StageRows {
  const T* w;
  int units;
  int64_t row_step, row_off;
  int K;
  __device__ __forceinline__ const T* Row0(int u) const { return w + u * row_step * K; }
  __device__ __forceinline__ const T* Row1(int u) const { return w + (u * row_step + row_off) * K; }
};

// A GEMV stage over the grid (PlanStage) against the CTA's input row xs;
// split units add their parts through shared memory (red2). epi(u, v) runs
// on lane 0 of the unit's first warp with the full sums.
template <typename T, typename Epi>
__device__ __forceinline__ void GemvStage(const StageRows<T>& r, const float* xs, float2* red2, Epi epi) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const StagePlan sp = PlanStage(r.units);
  for (int it = 0; it < sp.iters; ++it) {
    const int u = sp.group + it * sp.groups;
    float2 v = make_float2(0.0f, 0.0f);
    if (u < r.units) v = DotPair<T>(r.Row0(u), r.Row1(u), xs, r.K, sp.part, sp.parts);
    if (sp.parts > 1) {
      if (lane == 0) red2[warp] = v;
      __syncthreads();
      if (sp.part == 0) {
        for (int q = 1; q < sp.parts; ++q) {
          v.x += red2[warp + q].x;
          v.y += red2[warp + q].y;
        }
      }
      __syncthreads();
    }
    if (sp.part == 0 && lane == 0 && u < r.units) epi(u, v);
  }
}

// Lane 0 of the warp prefetches rows r0 and r1 (row_bytes each) into L2.
__device__ __forceinline__ void PrefetchRows(const void* w, int64_t r0, int64_t r1, int64_t row_bytes, bool on) {
  if (!on || (threadIdx.x & 31) != 0) return;
  const char* base = static_cast<const char*>(w);
  PrefetchL2(base + r0 * row_bytes, row_bytes);
  PrefetchL2(base + r1 * row_bytes, row_bytes);
}

// Context splits of the attention: one CTA per (kv head, split), each split
// at least kMinSplitKeys keys, at most kMaxSplits, within the grid.
constexpr int kMinSplitKeys = 64;
constexpr int kMaxSplits = 32;
__device__ __forceinline__ int AttentionSplits(int ctx, int Hkv) {
  const int by_keys = (ctx + kMinSplitKeys - 1) / kMinSplitKeys;
  return max(1, min(min(by_keys, kMaxSplits), static_cast<int>(gridDim.x) / Hkv));
}

// The attention of the query row for kv head hk over keys [kbeg, kend) of
// the paged cache (one CTA): its G query heads (q pre-rotated, fp32 in qf).
// The warps form G / GW groups of GW query heads each (GW <= 2: four heads'
// accumulators in one lane pushed the kernel past 128 registers a thread), a
// group's warps split the keys, D/8 lanes a key, and keep an online softmax
// per head; the CTA merges them through shared memory. With one split the
// CTA writes the heads' rows of aof; else its (acc, max, sum) go to `parts`
// and the last split of the kv head to finish merges them into aof. qs: G *
// Dh floats of shared memory (the stage's free input row); att: kWarps * GW
// * (Dh + 2).
template <typename T, int Dh, int G>
__device__ void AttendKvHead(const DecodeMegaParams& p, const MegaLayer& L, int hk, int split, int splits, int ctx,
                             const float* qf, float* aof, float* parts, unsigned* done, float* qs, float* att) {
  const int part_len = (ctx + splits - 1) / splits;
  const int kbeg = split * part_len, kend = min(ctx, kbeg + part_len);
  constexpr int GW = G > 2 ? 2 : G;  // query heads a warp keeps
  constexpr int kWarpsPerGroup = kWarps / (G / GW);
  constexpr int kLanes = Dh / 8;             // lanes per key, 8 dims each
  constexpr int kKeysPerWarp = 32 / kLanes;  // keys a warp takes per step
  constexpr int kU = 4;                      // steps whose loads are in flight together
  constexpr int kStride = kWarpsPerGroup * kKeysPerWarp;
  constexpr int kRow = Dh + 2;  // att row: acc[Dh], m, l
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g0 = (warp / kWarpsPerGroup) * GW, wi = warp % kWarpsPerGroup;
  const int grp = lane / kLanes, d0 = (lane % kLanes) * 8;
  const float qscale = p.scale * kLog2e;  // softmax in base 2
  for (int i = threadIdx.x; i < G * Dh; i += kThreads) qs[i] = __ldcg(qf + hk * G * Dh + i) * qscale;
  __syncthreads();
  float m[GW], l[GW], acc[GW][8];
#pragma unroll
  for (int g = 0; g < GW; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
  const T* Kc = static_cast<const T*>(L.k_cache);
  const T* Vc = static_cast<const T*>(L.v_cache);
  const int bs = p.block_size;
  // The trip count is the warp's (jw), not the lane's: the score shuffles
  // need every lane.
  for (int jw = kbeg + wi * kKeysPerWarp; jw < kend; jw += kStride * kU) {
    const int j0 = jw + grp;  // this lane's key in step 0
    uint4 kr[kU], vr[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = j0 + u * kStride;
      if (j < kend) {
        const int64_t slot = static_cast<int64_t>(p.block_table[j / bs]) * bs + j % bs;
        const int64_t off = (slot * p.Hkv + hk) * Dh + d0;
        kr[u] = __ldcg(reinterpret_cast<const uint4*>(Kc + off));
        vr[u] = __ldcg(reinterpret_cast<const uint4*>(Vc + off));
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool valid = j0 + u * kStride < kend;
      float kf[8], vf[8];
      Unpack8<T>(valid ? kr[u] : make_uint4(0u, 0u, 0u, 0u), kf);
      Unpack8<T>(valid ? vr[u] : make_uint4(0u, 0u, 0u, 0u), vf);
#pragma unroll
      for (int g = 0; g < GW; ++g) {
        const float4 qa = *reinterpret_cast<const float4*>(qs + (g0 + g) * Dh + d0);
        const float4 qb = *reinterpret_cast<const float4*>(qs + (g0 + g) * Dh + d0 + 4);
        const float q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(q[e], kf[e], s);
#pragma unroll
        for (int o = 1; o < kLanes; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (valid) {
          const float mn = fmaxf(m[g], s);
          const float c = exp2f(m[g] - mn);  // 0 while m is -inf
          const float pr = exp2f(s - mn);
          l[g] = l[g] * c + pr;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(acc[g][e], c, pr * vf[e]);
          m[g] = mn;
        }
      }
    }
  }
  // The warp's key groups into group 0 (lanes kLanes apart hold the same dims).
#pragma unroll
  for (int o = kLanes; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < GW; ++g) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float M = fmaxf(m[g], mo);
      const float c0 = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - M);
      const float c1 = mo == -INFINITY ? 0.0f : exp2f(mo - M);
      l[g] = l[g] * c0 + lo * c1;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
        acc[g][e] = acc[g][e] * c0 + ao * c1;
      }
      m[g] = M;
    }
  }
  if (grp == 0) {
#pragma unroll
    for (int g = 0; g < GW; ++g) {
      float* r = att + (warp * GW + g) * kRow;
#pragma unroll
      for (int e = 0; e < 8; ++e) r[d0 + e] = acc[g][e];
      if (d0 == 0) {
        r[Dh] = m[g];
        r[Dh + 1] = l[g];
      }
    }
  }
  __syncthreads();
  // Head g's warps: those of its group, each with its state at slot g % GW.
  for (int idx = threadIdx.x; idx < G * Dh; idx += kThreads) {
    const int g = idx / Dh, d = idx % Dh;
    const int w0 = (g / GW) * kWarpsPerGroup, gs = g % GW;
    float M = -INFINITY;
    for (int w = w0; w < w0 + kWarpsPerGroup; ++w) M = fmaxf(M, att[(w * GW + gs) * kRow + Dh]);
    float Ls = 0.0f, A = 0.0f;
    for (int w = w0; w < w0 + kWarpsPerGroup; ++w) {
      const float* r = att + (w * GW + gs) * kRow;
      if (r[Dh] == -INFINITY) continue;
      const float c = exp2f(r[Dh] - M);
      Ls += r[Dh + 1] * c;
      A += r[d] * c;
    }
    if (splits == 1) {
      aof[(hk * G + g) * Dh + d] = Ls > 0.0f ? A / Ls : 0.0f;
    } else {
      float* r = parts + ((static_cast<int64_t>(hk) * kMaxSplits + split) * G + g) * kRow;
      r[d] = A;
      if (d == 0) {
        r[Dh] = M;
        r[Dh + 1] = Ls;
      }
    }
  }
  if (splits == 1) return;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = LastBlockToFinish(done + hk, splits);
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < G * Dh; idx += kThreads) {
    const int g = idx / Dh, d = idx % Dh;
    const float* r0 = parts + (static_cast<int64_t>(hk) * kMaxSplits * G + g) * kRow;
    float M = -INFINITY;
    for (int sp = 0; sp < splits; ++sp) M = fmaxf(M, __ldcg(r0 + sp * G * kRow + Dh));
    float Ls = 0.0f, A = 0.0f;
    for (int sp = 0; sp < splits; ++sp) {
      const float* r = r0 + sp * G * kRow;
      const float m = __ldcg(r + Dh);
      if (m == -INFINITY) continue;
      const float c = exp2f(m - M);
      Ls += __ldcg(r + Dh + 1) * c;
      A += __ldcg(r + d) * c;
    }
    aof[(hk * G + g) * Dh + d] = Ls > 0.0f ? A / Ls : 0.0f;
  }
}

// Probe bits (FUSEDSERVE_MEGA_PROBE, timing only: the results are wrong):
// skip the GEMV stages' dot products, skip the attention.
constexpr int kProbeNoGemv = 1, kProbeNoAttention = 2;

template <typename T, int Dh, int G>
__global__ void __launch_bounds__(kThreads, 1) DecodeMegakernel(DecodeMegaParams p, int vec_floats) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);  // [vec_floats]: the stage's input row
  float* att = xs + vec_floats;                 // [kWarps][<= G][Dh + 2]: the attention's per-warp states
  __shared__ float red[kWarps];
  __shared__ float2 red2[kWarps];
  unsigned* count = static_cast<unsigned*>(p.workspace);
  unsigned* gen = count + 1;
  unsigned* done = count + kDoneAt;                                                    // [Hkv]
  float* qf = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kSyncBytes);  // [Hq Dh]
  float* aof = qf + p.Hq * Dh;                                                         // [Hq Dh]
  float* hf = aof + p.Hq * Dh;                                                         // [I]
  float* parts = hf + p.I;                                                             // [Hkv][kMaxSplits][G][Dh + 2]
  const int warp = threadIdx.x >> 5;
  const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps;
  const int D = p.D, I = p.I, Hq = p.Hq, Hkv = p.Hkv, QD = p.Hq * Dh;
  const int pos = p.position[0], ctx = p.ctx[0];
  const int64_t slot = p.slot[0];
  const bool pf_attn = (p.prefetch & 1) != 0, pf_next = (p.prefetch & 2) != 0;
  const bool gemv = (p.probe & kProbeNoGemv) == 0;
  T* x = static_cast<T*>(p.x);
  const int64_t half = Dh / 2;
  const int splits = AttentionSplits(ctx, Hkv);
  unsigned target = threadIdx.x == 0 ? LoadAcquire(gen) : 0u;
  auto add_residual = [&](int u, float2 v) {
    const int64_t r0 = 2 * static_cast<int64_t>(u);
    x[r0] = FromFloat<T>(ToFloat(__ldcg(x + r0)) + v.x);
    x[r0 + 1] = FromFloat<T>(ToFloat(__ldcg(x + r0 + 1)) + v.y);
  };

  // Each stage's weights as GEMV units (StageRows) for layer li.
  auto qkv_rows = [&](int li) {
    return StageRows<T>{static_cast<const T*>(p.layers[li].wqkv), (Hq + 2 * Hkv) * Dh / 2, 2, 1, D};
  };
  auto o_rows = [&](int li) { return StageRows<T>{static_cast<const T*>(p.layers[li].wo), D / 2, 2, 1, QD}; };
  auto gate_up_rows = [&](int li) { return StageRows<T>{static_cast<const T*>(p.layers[li].gate_up), I, 1, I, D}; };
  auto down_rows = [&](int li) { return StageRows<T>{static_cast<const T*>(p.layers[li].down), D / 2, 2, 1, I}; };

  for (int li = 0; li < p.num_layers; ++li) {
    // Read where used (a copy of the table row held 16 registers through the attention).
    const MegaLayer& L = p.layers[li];

    // 1. RMS norm, QKV (row pairs), rope, q -> qf, k/v -> the cache.
    LoadRow<T, T>(x, static_cast<const T*>(L.attn_norm), D, p.eps, xs, red);
    const int qkv_units = (Hq + 2 * Hkv) * Dh / 2;
    if (gemv) {
      GemvStage<T>(qkv_rows(li), xs, red2, [&](int u, float2 v) {
        const int64_t r0 = 2 * static_cast<int64_t>(u);
        const int h = static_cast<int>(r0 / Dh), e = static_cast<int>(r0 % Dh);
        if (h < Hq + Hkv) {
          const int i = e / 2;
          const float2 cs = p.cos_sin[static_cast<int64_t>(pos) * half + i];
          const float ta = v.x * cs.x - v.y * cs.y, tb = v.y * cs.x + v.x * cs.y;
          if (h < Hq) {
            qf[h * Dh + i] = ta;
            qf[h * Dh + i + half] = tb;
          } else {
            T* k = static_cast<T*>(L.k_cache) + (slot * Hkv + (h - Hq)) * Dh;
            k[i] = FromFloat<T>(ta);
            k[i + half] = FromFloat<T>(tb);
          }
        } else {
          T* vc = static_cast<T*>(L.v_cache) + (slot * Hkv + (h - Hq - Hkv)) * Dh + e;
          vc[0] = FromFloat<T>(v.x);
          vc[1] = FromFloat<T>(v.y);
        }
      });
    }
    if (pf_next) {
      for (int u = gw; u < D / 2; u += nw) PrefetchRows(L.wo, 2 * u, 2 * u + 1, int64_t{QD} * sizeof(T), true);
    }
    GridBarrier(count, gen, target);

    // 2. Attention: one CTA per (kv head, context split); the others may
    // prefetch their first gate/up rows meanwhile.
    if (static_cast<int>(blockIdx.x) < Hkv * splits) {
      if ((p.probe & kProbeNoAttention) == 0) {
        AttendKvHead<T, Dh, G>(p, L, blockIdx.x / splits, blockIdx.x % splits, splits, ctx, qf, aof, parts, done, xs,
                               att);
      }
    } else if (pf_attn && gw < I) {
      PrefetchRows(L.gate_up, gw, gw + I, int64_t{D} * sizeof(T), true);
    }
    GridBarrier(count, gen, target);

    // 3. o_proj + residual.
    LoadRow<float, T>(aof, nullptr, QD, 0.0f, xs, red);
    if (gemv) GemvStage<T>(o_rows(li), xs, red2, add_residual);
    GridBarrier(count, gen, target);

    // 4. RMS norm, gate_up, SwiGLU -> hf.
    LoadRow<T, T>(x, static_cast<const T*>(L.mlp_norm), D, p.eps, xs, red);
    if (gemv) {
      GemvStage<T>(gate_up_rows(li), xs, red2, [&](int u, float2 v) { hf[u] = v.x / (1.0f + __expf(-v.x)) * v.y; });
    }
    if (pf_next) {
      for (int u = gw; u < D / 2; u += nw) PrefetchRows(L.down, 2 * u, 2 * u + 1, int64_t{I} * sizeof(T), true);
    }
    GridBarrier(count, gen, target);

    // 5. down + residual.
    LoadRow<float, T>(hf, nullptr, I, 0.0f, xs, red);
    if (gemv) GemvStage<T>(down_rows(li), xs, red2, add_residual);
    if (li + 1 < p.num_layers) {
      if (pf_next) {
        const void* next = p.layers[li + 1].wqkv;
        for (int u = gw; u < qkv_units; u += nw) PrefetchRows(next, 2 * u, 2 * u + 1, int64_t{D} * sizeof(T), true);
      }
    }
    GridBarrier(count, gen, target);
  }
}

// An integer knob from the environment (A/B runs), else `fallback`.
int EnvInt(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && *e >= '0' && *e <= '9' ? std::atoi(e) : fallback;
}

int VecFloats(const DecodeMegaParams& p) { return std::max({p.D, p.I, p.Hq * p.Dh}); }

template <typename T, int Dh, int G>
CudaStatus LaunchTyped(const DecodeMegaParams& params, cudaStream_t stream) {
  DecodeMegaParams p = params;
  static const int prefetch = EnvInt("FUSEDSERVE_MEGA_PREFETCH", 0);
  static const int probe = EnvInt("FUSEDSERVE_MEGA_PROBE", 0);

  if (p.prefetch < 0) p.prefetch = prefetch;
  p.probe = probe;
  auto kernel = DecodeMegakernel<T, Dh, G>;
  const int vec = VecFloats(p);
  const size_t smem = (static_cast<size_t>(vec) + static_cast<size_t>(kWarps) * G * (Dh + 2)) * sizeof(float);
  if (CudaStatus s = FS_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      !s.ok())
    return s;
  int device = 0, sms = 0, per_sm = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&device)); !s.ok()) return s;
  if (CudaStatus s = FS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)); !s.ok())
    return s;
  if (CudaStatus s = FS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
      !s.ok())
    return s;
  if (per_sm < 1 || sms < p.Hkv) return CudaStatus::Unsupported("decode megakernel: one CTA per SM does not fit");
  const KernelRange range(reinterpret_cast<const void*>(kernel));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(sms));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  // Cooperative: the launch fails instead of deadlocking in a grid barrier
  // if the CTAs cannot all be resident. No programmatic serialisation: the
  // kernel starts once the previous one has left every SM.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return FS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, vec));
}

template <typename T, int Dh>
CudaStatus LaunchGroups(const DecodeMegaParams& p, cudaStream_t stream) {
  const int G = p.Hq / p.Hkv;
  if (G == 1) return LaunchTyped<T, Dh, 1>(p, stream);
  if (G == 2) return LaunchTyped<T, Dh, 2>(p, stream);
  return LaunchTyped<T, Dh, 4>(p, stream);
}

}  // namespace

bool DecodeMegakernelSupported(DType dtype, int D, int I, int Hq, int Hkv, int Dh) {
  if (dtype != DType::kBF16 && dtype != DType::kF16) return false;
  if (Dh != 64 && Dh != 128) return false;
  if (Hkv <= 0 || Hkv > kMaxKvHeads || Hq % Hkv != 0) return false;
  const int G = Hq / Hkv;
  if (G != 1 && G != 2 && G != 4) return false;
  return D > 0 && I > 0 && D % 8 == 0 && I % 8 == 0 && (Hq * Dh) % 8 == 0 && D <= kMaxRow && I <= kMaxRow &&
         Hq * Dh <= kMaxRow;
}

size_t DecodeMegakernelWorkspaceBytes(int I, int Hq, int Hkv, int Dh) {
  const size_t parts = static_cast<size_t>(Hkv) * kMaxSplits * (Hq / Hkv) * (Dh + 2);
  return kSyncBytes + (2 * static_cast<size_t>(Hq) * Dh + static_cast<size_t>(I) + parts) * sizeof(float);
}

CudaStatus LaunchDecodeMegakernel(const DecodeMegaParams& p, cudaStream_t stream) {
  if (!DecodeMegakernelSupported(p.dtype, p.D, p.I, p.Hq, p.Hkv, p.Dh)) {
    return CudaStatus::Unsupported("decode megakernel: bf16/fp16, head dim 64/128, 1/2/4 query heads per kv head");
  }
  if (p.workspace == nullptr || p.layers == nullptr) return CudaStatus::Error("decode megakernel: no workspace");
  CudaStatus st = CudaStatus::Unsupported("decode megakernel: unsupported dtype");
  if (p.dtype == DType::kBF16) {
    st = p.Dh == 64 ? LaunchGroups<__nv_bfloat16, 64>(p, stream) : LaunchGroups<__nv_bfloat16, 128>(p, stream);
  } else {
    st = p.Dh == 64 ? LaunchGroups<__half, 64>(p, stream) : LaunchGroups<__half, 128>(p, stream);
  }
  return st;
}

}  // namespace fusedserve::cuda
