// The one-sequence decode megakernel (see decode_megakernel.h).
//
// Grid: one CTA of 16 warps per SM, launched cooperatively (every CTA resident,
// as the grid barrier needs). Work of a GEMV stage is spread over all warps of
// the grid (PlanStage: a unit is a pair of weight rows, as in gemv.cu: a
// rotation pair of QKV, a gate/up pair of the SwiGLU; with fewer units than
// warps, 2-4 warps split a unit's K) against the stage's input row, which every
// CTA holds in shared memory as fp32 (normalised there when the stage starts
// with an RMS norm). The attention of the one query row takes one CTA per (kv
// head, context split): its warps split the keys, each keeps an online softmax
// for the kv head's query heads, the CTA merges them through shared memory and
// the last split of a kv head merges the splits. Rows that pass between stages
// (q, the attention output, the SwiGLU activation) stay fp32 in the workspace;
// the residual row x is updated in place in the model dtype, as the unfused
// kernels store it. Data written by other CTAs in an earlier stage (x, those
// rows, the new token's cache row) is read through L2 (__ldcg): L1 is not
// coherent across SMs. The weight rows reach the warps through per-warp
// cp.async rings in shared memory that run ahead of the stages (WeightStream):
// the copies of the next stage's rows are in flight while the grid waits at a
// barrier.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_megakernel.h"
#include "kernels/cuda/env_knob.h"

namespace fusedserve::cuda {
namespace {

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
// Weight slots (1 KB each) in flight per warp (WeightStream): 8 and 4
// measured the same (the stream is not latency-bound at either).
constexpr int kStreamDepth = 8;
constexpr float kLog2e = 1.4426950408889634f;
// The workspace: the barrier's counter (64-bit), at kDoneAt the
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

// Every CTA of the grid arrives before any leaves; the writes of all CTAs
// before it are visible to all after it. `count` only grows: each CTA adds
// one per barrier (a release, which also publishes what the CTA's other
// threads wrote before the __syncthreads), so barrier b of a launch is
// passed when it reaches the next multiple of the grid size, and polls it
// with acquire loads. Two L2 round trips on the critical path; no reset, no
// full fence (a fence would also wait for the warp's weight copies in flight).
// The counter is 64-bit, zeroed when the workspace is allocated, and stays a
// multiple of the grid size between launches.
__device__ __forceinline__ void GridBarrier(unsigned long long* count) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long v;
    asm volatile("atom.add.release.gpu.u64 %0, [%1], 1;" : "=l"(v) : "l"(count) : "memory");
    const unsigned long long target = v - v % gridDim.x + gridDim.x;
    unsigned long long c;
    do {
      asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(c) : "l"(count) : "memory");
    } while (c < target);
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
// unit's K; warp group g takes units g iters, g iters + 1, ... (iters
// rounds, the same in every warp of a CTA): one stream of consecutive rows,
// as the GEMV kernel reads them (1-2% faster than units g, g + groups, ...).
struct StagePlan {
  int parts, part, group, groups, iters;
  __device__ __forceinline__ int Unit(int it) const { return group * iters + it; }
};
__device__ __forceinline__ StagePlan PlanStage(int units) {
  const int warp = threadIdx.x >> 5, nw = gridDim.x * kWarps;
  StagePlan sp;
  sp.parts = 1;
  while (sp.parts < 4 && units * sp.parts * 2 <= nw) sp.parts *= 2;
  // Groups numbered across the CTAs first, so that a stage with fewer
  // units than warps still streams on every SM.
  const int per_cta = kWarps / sp.parts;
  sp.group = (warp / sp.parts) * gridDim.x + blockIdx.x;
  sp.groups = gridDim.x * per_cta;
  sp.part = warp % sp.parts;
  sp.iters = (units + sp.groups - 1) / sp.groups;
  return sp;
}

// The GEMV stage's weights as units: unit u is rows u * row_step and
// u * row_step + row_off of w (K columns each).
template <typename T>
struct StageRows {
  const T* w;
  int units;
  int row_step, row_off;
  int K;
  __device__ __forceinline__ const T* Row0(int u) const { return w + static_cast<int64_t>(u) * row_step * K; }
  __device__ __forceinline__ const T* Row1(int u) const {
    return w + (static_cast<int64_t>(u) * row_step + row_off) * K;
  }
};

// A step's GEMV stages in order: stage s is layer s / kGemvStages's QKV,
// o_proj, gate_up or down.
constexpr int kGemvStages = 4;
enum GemvStageKind { kQkv = 0, kOproj = 1, kGateUp = 2, kDown = 3 };
template <typename T>
__device__ __forceinline__ StageRows<T> GemvRows(const DecodeMegaParams& p, const MegaLayer* layers, int s) {
  const MegaLayer& L = layers[s / kGemvStages];
  switch (s % kGemvStages) {
    case kQkv:  // rotation pairs (rows 2u, 2u + 1)
      return {static_cast<const T*>(L.wqkv), (p.Hq + 2 * p.Hkv) * p.Dh / 2, 2, 1, p.D};
    case kOproj:
      return {static_cast<const T*>(L.wo), p.D / 2, 2, 1, p.Hq * p.Dh};
    case kGateUp:  // gate row u with up row u + I
      return {static_cast<const T*>(L.gate_up), p.I, 1, p.I, p.D};
    default:
      return {static_cast<const T*>(L.down), p.D / 2, 2, 1, p.I};
  }
}

// Steps of a round of PlanStage (every lane of the warp takes the same
// count; lane l's vector of step k is l + 32 (part + parts k), if < K / 8).
__device__ __forceinline__ int StepsPerRound(int K, const StagePlan& sp) {
  const int nvec = K / 8, first = 32 * sp.part, stride = 32 * sp.parts;
  return nvec > first ? (nvec - first + stride - 1) / stride : 0;
}

// The weights of a warp's GEMV stages, streamed into shared memory ahead of
// their use. Slot n of the stream is (stage s, round, step k): each lane's
// vector of step k of the round's unit's two rows. The warp keeps kDepth
// slots (kDepth KB) in flight, issued in the order the stages consume them,
// across the grid barriers and the attention: the next stage's first weights
// arrive while the grid waits for that stage's input, so HBM does not idle
// at a stage boundary (a barrier and an input-row load take ~2 us).
template <typename T, int kDepth>
struct WeightStream {
  uint4* ring;  // this warp's [kDepth][2][32] vectors
  uint64_t policy;
  int head;  // ring slot consumed next
  // The issue cursor: stage s (of `stages`), round it, step k.
  const DecodeMegaParams* p;
  const MegaLayer* layers;  // the CTA's copy of the table (shared memory)
  int stages, s, it, k, steps;
  StageRows<T> r;
  StagePlan sp;
  const uint4 *a, *b;  // this lane's vectors of the round's rows, k = 0
  bool live;           // the round's unit exists

  __device__ void Start(const DecodeMegaParams& params, const MegaLayer* layer_table, int num_stages,
                        uint4* warp_ring) {
    p = &params;
    layers = layer_table;
    ring = warp_ring;
    policy = EvictFirstPolicy();
    head = 0;
    stages = num_stages;
    Open(0);
    for (int j = 0; j < kDepth; ++j) Issue(j);
  }
  // The first stage from s0 on with work for this warp.
  __device__ void Open(int s0) {
    for (s = s0; s < stages; ++s) {
      r = GemvRows<T>(*p, layers, s);
      sp = PlanStage(r.units);
      steps = StepsPerRound(r.K, sp);
      if (steps > 0) {
        it = 0;
        k = 0;
        Round();
        return;
      }
    }
  }
  __device__ void Round() {
    const int u = sp.Unit(it);
    const int lane0 = (threadIdx.x & 31) + 32 * sp.part;
    live = u < r.units;
    a = reinterpret_cast<const uint4*>(r.Row0(live ? u : 0)) + lane0;
    b = reinterpret_cast<const uint4*>(r.Row1(live ? u : 0)) + lane0;
  }
  // Copies the cursor's slot into ring slot j and advances the cursor.
  __device__ void Issue(int j) {
    if (s < stages) {
      const int lane = threadIdx.x & 31;
      const int i = lane + 32 * (sp.part + sp.parts * k);
      if (live && i < r.K / 8) {
        CpAsync16Stream(ring + j * 64 + lane, a + 32 * sp.parts * k, policy);
        CpAsync16Stream(ring + j * 64 + 32 + lane, b + 32 * sp.parts * k, policy);
      }
      if (++k == steps) {
        k = 0;
        if (++it < sp.iters) {
          Round();
        } else {
          Open(s + 1);
        }
      }
    }
    CpAsyncCommit();  // empty groups keep the wait count uniform
  }
  // The next slot's two vectors (stale where the lane's vector does not
  // exist); Refill once they are used.
  __device__ __forceinline__ void Next(uint4& va, uint4& vb) {
    CpAsyncWait<kDepth - 1>();
    const int lane = threadIdx.x & 31;
    va = ring[head * 64 + lane];
    vb = ring[head * 64 + 32 + lane];
  }
  __device__ __forceinline__ void Refill() {
    Issue(head);
    head = head + 1 == kDepth ? 0 : head + 1;
  }
};

// A GEMV stage over the grid (PlanStage) against the CTA's input row xs,
// its weights from the warp's stream; split units add their parts through
// shared memory (red2). On lane 0 of the unit's first warp, pre(u) loads
// the epilogue's operands before the dot products (so their L2 round trip
// overlaps them) and epi(u, v, pre(u)) gets the full sums.
template <typename T, int kDepth, typename Pre, typename Epi>
__device__ __forceinline__ void GemvStage(WeightStream<T, kDepth>& ws, const StageRows<T>& r, const float* xs,
                                          float2* red2, Pre pre, Epi epi, bool dots) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const StagePlan sp = PlanStage(r.units);
  const int steps = StepsPerRound(r.K, sp), nvec = r.K / 8;
  for (int it = 0; it < sp.iters; ++it) {
    const int u = sp.Unit(it);
    const bool owner = sp.part == 0 && lane == 0 && u < r.units;
    const float2 op = owner ? pre(u) : make_float2(0.0f, 0.0f);
    float s0 = 0.0f, s1 = 0.0f;
    for (int k = 0; k < steps; ++k) {
      uint4 va, vb;
      ws.Next(va, vb);
      const int i = lane + 32 * (sp.part + sp.parts * k);
      if (u < r.units && i < nvec && dots) {
        const float4 x0 = *reinterpret_cast<const float4*>(xs + 8 * i);
        const float4 x1 = *reinterpret_cast<const float4*>(xs + 8 * i + 4);
        const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        float fa[8], fb[8];
        Unpack8<T>(va, fa);
        Unpack8<T>(vb, fb);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          s0 = fmaf(fa[e], xv[e], s0);
          s1 = fmaf(fb[e], xv[e], s1);
        }
      }
      ws.Refill();
    }
    float2 v = make_float2(GroupReduce(s0, SumOp{}, 32), GroupReduce(s1, SumOp{}, 32));
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
    if (owner) epi(u, v, op);
  }
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
        s = GroupReduce(s, SumOp{}, kLanes);
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

// Probe bits (FUSEDSERVE_MEGA_PROBE; 1, 2 and 4 are for timing only, their
// results are wrong): skip the GEMV stages (no weights read), skip the
// attention, stream the GEMV stages' weights without the dot products.
// Bit 8 records clock64 stamps per CTA and stage (begin, input row loaded,
// work done) and prints a per-stage and per-CTA summary after each eager
// launch.
constexpr int kProbeNoGemv = 1, kProbeNoAttention = 2, kProbeNoDots = 4, kProbeStamps = 8;
constexpr int kStampSms = 160, kStampLayers = 40, kStagesPerLayer = 5;
__device__ long long g_stamps[kStampSms][kStampLayers * kStagesPerLayer * 3];
__device__ int g_smid[kStampSms];

// Shared memory: the warps' weight rings, the stage's input row (fp32), the
// attention's per-warp states, the layer table.
constexpr size_t kRingBytes = static_cast<size_t>(kWarps) * kStreamDepth * 64 * sizeof(uint4);

template <typename T, int Dh, int G>
__global__ void __launch_bounds__(kThreads, 1) DecodeMegakernel(DecodeMegaParams p, int vec_floats) {
  extern __shared__ float4 smem4[];
  uint4* rings = reinterpret_cast<uint4*>(smem4);                 // [kWarps][kStreamDepth][2][32]
  float* xs = reinterpret_cast<float*>(smem4 + kRingBytes / 16);  // [vec_floats]: the stage's input row
  float* att = xs + vec_floats;  // [kWarps][<= G][Dh + 2]: the attention's per-warp states
  // [num_layers]: read on every stage change; from global memory that is an
  // L2 round trip queued behind the weight stream.
  MegaLayer* layers = reinterpret_cast<MegaLayer*>(att + kWarps * G * (Dh + 2));
  __shared__ float red[kWarps];
  __shared__ float2 red2[kWarps];
  const int warp = threadIdx.x >> 5;
  const bool gemv = (p.probe & kProbeNoGemv) == 0, dots = (p.probe & kProbeNoDots) == 0;
  for (int i = threadIdx.x; i < p.num_layers; i += kThreads) layers[i] = p.layers[i];
  __syncthreads();
  WeightStream<T, kStreamDepth> ws;
  ws.Start(p, layers, gemv ? p.num_layers * kGemvStages : 0, rings + warp * kStreamDepth * 64);
  unsigned long long* count = static_cast<unsigned long long*>(p.workspace);
  unsigned* done = static_cast<unsigned*>(p.workspace) + kDoneAt;                      // [Hkv]
  float* qf = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + kSyncBytes);  // [Hq Dh]
  float* aof = qf + p.Hq * Dh;                                                         // [Hq Dh]
  float* hf = aof + p.Hq * Dh;                                                         // [I]
  float* parts = hf + p.I;                                                             // [Hkv][kMaxSplits][G][Dh + 2]
  const int D = p.D, Hkv = p.Hkv, Hq = p.Hq, QD = p.Hq * Dh;
  const int pos = p.position[0], ctx = p.ctx[0];
  const int64_t slot = p.slot[0];
  T* x = static_cast<T*>(p.x);
  const int64_t half = Dh / 2;
  const int splits = AttentionSplits(ctx, Hkv);
  const bool stamps = (p.probe & kProbeStamps) != 0 && blockIdx.x < kStampSms;
  if (stamps && threadIdx.x == 0) {
    int smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    g_smid[blockIdx.x] = smid;
  }
  // Stamp e (0 begin, 1 row loaded, 2 work done) of stage st of layer li.
  auto stamp = [&](int li, int st, int e) {
    if (!stamps || li >= kStampLayers) return;
    if (e == 2) __syncthreads();
    if (threadIdx.x == 0) g_stamps[blockIdx.x][(li * kStagesPerLayer + st) * 3 + e] = clock64();
  };
  // o_proj and down: rows 2u, 2u + 1 of x += the sums.
  auto residual_of = [&](int u) {
    const int64_t r0 = 2 * static_cast<int64_t>(u);
    return make_float2(ToFloat(__ldcg(x + r0)), ToFloat(__ldcg(x + r0 + 1)));
  };
  auto add_residual = [&](int u, float2 v, float2 res) {
    const int64_t r0 = 2 * static_cast<int64_t>(u);
    x[r0] = FromFloat<T>(res.x + v.x);
    x[r0 + 1] = FromFloat<T>(res.y + v.y);
  };
  auto nothing = [](int) { return make_float2(0.0f, 0.0f); };

  for (int li = 0; li < p.num_layers; ++li) {
    // Read where used (a copy of the table row held 16 registers through the attention).
    const MegaLayer& L = layers[li];
    const int s0 = li * kGemvStages;

    // 1. RMS norm, QKV (row pairs), rope, q -> qf, k/v -> the cache.
    stamp(li, 0, 0);
    LoadRow<T, T>(x, static_cast<const T*>(L.attn_norm), D, p.eps, xs, red);
    stamp(li, 0, 1);
    if (gemv) {
      // Unit u: rows 2u, 2u + 1; (cos, sin) of its rotation pair for q and k heads.
      auto rotation_of = [&](int u) {
        const int64_t r0 = 2 * static_cast<int64_t>(u);
        const int h = static_cast<int>(r0 / Dh), e = static_cast<int>(r0 % Dh);
        return h < Hq + Hkv ? p.cos_sin[static_cast<int64_t>(pos) * half + e / 2] : make_float2(1.0f, 0.0f);
      };
      GemvStage<T>(
          ws, GemvRows<T>(p, layers, s0 + kQkv), xs, red2, rotation_of,
          [&](int u, float2 v, float2 cs) {
            const int64_t r0 = 2 * static_cast<int64_t>(u);
            const int h = static_cast<int>(r0 / Dh), e = static_cast<int>(r0 % Dh);
            if (h < Hq + Hkv) {
              const int i = e / 2;
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
          },
          dots);
    }
    stamp(li, 0, 2);
    GridBarrier(count);

    // 2. Attention: one CTA per (kv head, context split); every warp's
    // o_proj weights keep arriving meanwhile.
    stamp(li, 1, 0);
    stamp(li, 1, 1);
    if (static_cast<int>(blockIdx.x) < Hkv * splits && (p.probe & kProbeNoAttention) == 0) {
      AttendKvHead<T, Dh, G>(p, L, blockIdx.x / splits, blockIdx.x % splits, splits, ctx, qf, aof, parts, done, xs,
                             att);
    }
    stamp(li, 1, 2);
    GridBarrier(count);

    // 3. o_proj + residual.
    stamp(li, 2, 0);
    LoadRow<float, T>(aof, nullptr, QD, 0.0f, xs, red);
    stamp(li, 2, 1);
    if (gemv) GemvStage<T>(ws, GemvRows<T>(p, layers, s0 + kOproj), xs, red2, residual_of, add_residual, dots);
    stamp(li, 2, 2);
    GridBarrier(count);

    // 4. RMS norm, gate_up, SwiGLU -> hf.
    stamp(li, 3, 0);
    LoadRow<T, T>(x, static_cast<const T*>(L.mlp_norm), D, p.eps, xs, red);
    stamp(li, 3, 1);
    if (gemv) {
      GemvStage<T>(
          ws, GemvRows<T>(p, layers, s0 + kGateUp), xs, red2, nothing,
          [&](int u, float2 v, float2) { hf[u] = v.x / (1.0f + __expf(-v.x)) * v.y; }, dots);
    }
    stamp(li, 3, 2);
    GridBarrier(count);

    // 5. down + residual.
    stamp(li, 4, 0);
    LoadRow<float, T>(hf, nullptr, p.I, 0.0f, xs, red);
    stamp(li, 4, 1);
    if (gemv) GemvStage<T>(ws, GemvRows<T>(p, layers, s0 + kDown), xs, red2, residual_of, add_residual, dots);
    stamp(li, 4, 2);
    GridBarrier(count);
  }
  CpAsyncWaitAll();  // only empty groups are left
}

int VecFloats(const DecodeMegaParams& p) { return std::max({p.D, p.I, p.Hq * p.Dh}); }

// Prints, per stage kind, the CTAs' median and max of: loading the input
// row, the stage's work, and the wait from its end to the next stage's
// begin (the grid barrier), in us, averaged over layers 1.. (timing probe).
void PrintStamps(int sms, int layers, cudaStream_t stream) {
  static long long host[kStampSms][kStampLayers * kStagesPerLayer * 3];
  if (cudaStreamSynchronize(stream) != cudaSuccess || cudaMemcpyFromSymbol(host, g_stamps, sizeof(host)) != cudaSuccess)
    return;
  int device = 0, khz = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device);
  const double us_per_cycle = 1e3 / khz;
  const int n = std::min(sms, kStampSms), nl = std::min(layers, kStampLayers);
  static const char* kNames[kStagesPerLayer] = {"qkv", "attention", "o_proj", "gate_up", "down"};
  std::fprintf(stderr, "megakernel stamps (us; median / max over %d CTAs, mean over layers 1..%d)\n", n, nl - 1);
  for (int st = 0; st < kStagesPerLayer; ++st) {
    double acc[3][2] = {};
    for (int li = 1; li < nl; ++li) {
      std::vector<double> v[3];
      for (int b = 0; b < n; ++b) {
        const long long* t = host[b] + (li * kStagesPerLayer + st) * 3;
        const bool last = li + 1 == nl && st + 1 == kStagesPerLayer;
        const long long next = last ? t[2] : host[b][(li * kStagesPerLayer + st) * 3 + 3];
        v[0].push_back((t[1] - t[0]) * us_per_cycle);
        v[1].push_back((t[2] - t[1]) * us_per_cycle);
        v[2].push_back((next - t[2]) * us_per_cycle);
      }
      for (int k = 0; k < 3; ++k) {
        std::sort(v[k].begin(), v[k].end());
        acc[k][0] += v[k][v[k].size() / 2];
        acc[k][1] += v[k].back();
      }
    }
    const double d = nl - 1;
    std::fprintf(stderr, "  %-9s row %5.2f / %5.2f  work %6.2f / %6.2f  barrier %5.2f / %5.2f\n", kNames[st],
                 acc[0][0] / d, acc[0][1] / d, acc[1][0] / d, acc[1][1] / d, acc[2][0] / d, acc[2][1] / d);
  }
  // Is a CTA's speed its SM's? Per CTA, the mean work time of gate_up over
  // the first and the second half of the layers, and of down; correlations
  // across CTAs near 1 mean the same SMs are slow every time.
  int smid[kStampSms];
  if (cudaMemcpyFromSymbol(smid, g_smid, sizeof(smid)) != cudaSuccess || nl < 4) return;
  auto work = [&](int b, int st, int l0, int l1) {
    double w = 0.0;
    for (int li = l0; li < l1; ++li) {
      const long long* t = host[b] + (li * kStagesPerLayer + st) * 3;
      w += (t[2] - t[1]) * us_per_cycle;
    }
    return w / (l1 - l0);
  };
  std::vector<double> g1(n), g2(n), dn(n);
  for (int b = 0; b < n; ++b) {
    g1[b] = work(b, 3, 1, nl / 2);
    g2[b] = work(b, 3, nl / 2, nl);
    dn[b] = work(b, 4, 1, nl);
  }
  auto corr = [&](const std::vector<double>& x, const std::vector<double>& y) {
    double mx = 0, my = 0, sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; ++i) mx += x[i] / n, my += y[i] / n;
    for (int i = 0; i < n; ++i) {
      sxy += (x[i] - mx) * (y[i] - my);
      sxx += (x[i] - mx) * (x[i] - mx);
      syy += (y[i] - my) * (y[i] - my);
    }
    return sxy / std::sqrt(sxx * syy + 1e-30);
  };
  std::fprintf(stderr,
               "  per-CTA gate_up work: corr(first half, second half of layers) %.2f, corr(gate_up, down) %.2f\n",
               corr(g1, g2), corr(g1, dn));
  std::vector<int> order(n);
  for (int b = 0; b < n; ++b) order[b] = b;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return g1[a] + g2[a] < g1[b] + g2[b]; });
  std::fprintf(stderr, "  gate_up fastest (cta/sm us):");
  for (int i = 0; i < 6; ++i)
    std::fprintf(stderr, " %d/%d %.1f", order[i], smid[order[i]], (g1[order[i]] + g2[order[i]]) / 2);
  std::fprintf(stderr, "\n  gate_up slowest (cta/sm us):");
  for (int i = n - 6; i < n; ++i)
    std::fprintf(stderr, " %d/%d %.1f", order[i], smid[order[i]], (g1[order[i]] + g2[order[i]]) / 2);
  std::fprintf(stderr, "\n");
}

template <typename T, int Dh, int G>
CudaStatus LaunchTyped(const DecodeMegaParams& params, cudaStream_t stream) {
  DecodeMegaParams p = params;
  static const int probe = EnvKnob("FUSEDSERVE_MEGA_PROBE", 0, 255, 0);  // bits: decode_megakernel.h
  p.probe = probe;
  auto kernel = DecodeMegakernel<T, Dh, G>;
  const int vec = VecFloats(p);
  const size_t smem = kRingBytes +
                      (static_cast<size_t>(vec) + static_cast<size_t>(kWarps) * G * (Dh + 2)) * sizeof(float) +
                      static_cast<size_t>(p.num_layers) * sizeof(MegaLayer);
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
  CudaStatus st = FS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p, vec));
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (st.ok() && (p.probe & kProbeStamps) != 0 && cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
      capture == cudaStreamCaptureStatusNone) {
    PrintStamps(sms, p.num_layers, stream);
  }
  return st;
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
