// Paged-KV kernels of the CUDA model runner (see paged_attention.h):
//   GatherRowsKernel     one CTA per row, 16-byte copies when the row allows.
//   RopeKvVecKernel      one CTA per token of the fused QKV output, each thread
//                        a 16-byte vector of rotation pairs of one head;
//                        rotates q/k with the cos/sin table, stores dense
//                        q/k/v and the cache rows (RopeKvKernel: the same one
//                        pair per thread, for unaligned shapes).
//   PagedAttentionKernel one CTA per (query row, kv head, context split); the
//                        CTA's 128 threads form groups of D/8 lanes, each group
//                        streams four keys per iteration (16-byte K and V loads
//                        per lane, all issued before use, the next block-table
//                        lookups in flight meanwhile) and keeps an online
//                        softmax for all the query heads sharing that kv head
//                        (GQA: K/V read once); the groups are merged through
//                        shared memory at the end. With context splits, the
//                        last CTA of a (row, kv head) to finish merges the
//                        splits' (max, sum, acc): no combine kernel.
//   PagedAttentionMmaKernel the same work split with both products on tensor
//                        cores (mma.sync; bf16/fp16 at head dims 64 and 128,
//                        the default there): the query heads of a kv head
//                        are the rows of S = Q K^T, P V reuses S's registers.
//                        At up to four rows the splits of a (row, kv head)
//                        are a thread-block cluster and merge through
//                        distributed shared memory instead.
// The CPU reference of all of them is the CPU model runner
// (model/cpu_runner.cc); tests/gpu/model_cuda_test.cc compares the two.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/paged_attention.h"

namespace fusedserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxGroup = 8;  // query heads per kv head held in registers
constexpr float kLog2e = 1.4426950408889634f;

__global__ void GatherRowsKernel(const uint8_t* src, const int32_t* idx, int64_t row_bytes, bool vec16, uint8_t* dst) {
  PdlEnter();
  const int64_t i = blockIdx.x;
  const uint8_t* s = src + static_cast<int64_t>(idx[i]) * row_bytes;
  uint8_t* d = dst + i * row_bytes;
  if (vec16) {
    for (int64_t b = threadIdx.x * 16; b < row_bytes; b += blockDim.x * 16) {
      *reinterpret_cast<uint4*>(d + b) = *reinterpret_cast<const uint4*>(s + b);
    }
  } else {
    for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) d[b] = s[b];
  }
}

template <typename T>
__global__ void RopeKvKernel(RopeKvParams p) {
  PdlEnter();
  const int half = p.D / 2;
  const int H3 = p.Hq + 2 * p.Hkv;
  const int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (u >= p.T * H3 * half) return;
  const int i = static_cast<int>(u % half);
  const int h = static_cast<int>((u / half) % H3);
  const int64_t t = u / (static_cast<int64_t>(half) * H3);
  const T* src = static_cast<const T*>(p.qkv) + (t * H3 + h) * p.D;
  const bool pair = p.interleaved && h < p.Hq + p.Hkv;
  float a = ToFloat(src[pair ? 2 * i : i]);
  float b = ToFloat(src[pair ? 2 * i + 1 : i + half]);
  if (h < p.Hq + p.Hkv) {
    const float2 cs = p.cos_sin[static_cast<int64_t>(p.positions[t]) * half + i];
    const float ra = a * cs.x - b * cs.y;
    const float rb = b * cs.x + a * cs.y;
    a = ra;
    b = rb;
  }
  const T ta = FromFloat<T>(a), tb = FromFloat<T>(b);
  if (h < p.Hq) {
    T* q = static_cast<T*>(p.q) + (t * p.Hq + h) * p.D;
    q[i] = ta;
    q[i + half] = tb;
    return;
  }
  const bool is_k = h < p.Hq + p.Hkv;
  const int kh = is_k ? h - p.Hq : h - p.Hq - p.Hkv;
  T* dense = static_cast<T*>(is_k ? p.k : p.v);
  if (dense != nullptr) {
    T* r = dense + (t * p.Hkv + kh) * p.D;
    r[i] = ta;
    r[i + half] = tb;
  }
  if (p.slots != nullptr) {
    T* cache = static_cast<T*>(is_k ? p.k_cache : p.v_cache);
    T* r = cache + (static_cast<int64_t>(p.slots[t]) * p.Hkv + kh) * p.D;
    r[i] = ta;
    r[i + half] = tb;
  }
}

// The same with 16-byte accesses: one CTA per token, each thread takes K =
// kVec16<T> consecutive rotation pairs (i0 .. i0+K-1) of one head: two
// vector loads (interleaved: 2K elements from 2 i0; plain: K from i0 and K
// from i0 + D/2), the token's position, slot and cos/sin row shared by the
// CTA, two vector stores per destination. The scalar kernel above (a thread
// per pair, 2-byte accesses, 64-bit index divisions) ran an 8B prefill chunk
// of 4096 tokens at a third of the copy bandwidth (102 us for ~110 MB).
template <typename T>
__global__ void RopeKvVecKernel(RopeKvParams p) {
  constexpr int K = kVec16<T>;
  PdlEnter();
  const int half = p.D / 2;
  const int chunks = half / K;
  const int H3 = p.Hq + 2 * p.Hkv;
  const int64_t t = blockIdx.x;
  const float2* cs = p.cos_sin + static_cast<int64_t>(p.positions[t]) * half;
  const int64_t slot = p.slots != nullptr ? p.slots[t] : 0;
  const T* row = static_cast<const T*>(p.qkv) + t * H3 * p.D;
  for (int u = threadIdx.x; u < H3 * chunks; u += blockDim.x) {
    const int h = u / chunks;
    const int i0 = (u - h * chunks) * K;
    const T* src = row + h * p.D;
    const bool rotate = h < p.Hq + p.Hkv;
    float a[K], b[K];
    if (rotate && p.interleaved) {
      Vec<T, K> v0, v1;
      v0.Load(src + 2 * i0);
      v1.Load(src + 2 * i0 + K);
      float f0[K], f1[K];
      v0.ToFloats(f0);
      v1.ToFloats(f1);
#pragma unroll
      for (int k = 0; k < K / 2; ++k) {
        a[k] = f0[2 * k];
        b[k] = f0[2 * k + 1];
        a[K / 2 + k] = f1[2 * k];
        b[K / 2 + k] = f1[2 * k + 1];
      }
    } else {
      Vec<T, K> va, vb;
      va.Load(src + i0);
      vb.Load(src + half + i0);
      va.ToFloats(a);
      vb.ToFloats(b);
    }
    if (rotate) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float2 c = cs[i0 + k];
        const float ra = a[k] * c.x - b[k] * c.y;
        b[k] = b[k] * c.x + a[k] * c.y;
        a[k] = ra;
      }
    }
    Vec<T, K> oa, ob;
    oa.FromFloats(a);
    ob.FromFloats(b);
    auto store = [&](T* r) {
      oa.Store(r + i0);
      ob.Store(r + half + i0);
    };
    if (h < p.Hq) {
      store(static_cast<T*>(p.q) + (t * p.Hq + h) * p.D);
      continue;
    }
    const bool is_k = h < p.Hq + p.Hkv;
    const int kh = is_k ? h - p.Hq : h - p.Hq - p.Hkv;
    T* dense = static_cast<T*>(is_k ? p.k : p.v);
    if (dense != nullptr) store(dense + (t * p.Hkv + kh) * p.D);
    if (p.slots != nullptr) store(static_cast<T*>(is_k ? p.k_cache : p.v_cache) + (slot * p.Hkv + kh) * p.D);
  }
}

// kG: query heads per kv head the CTA holds in registers (a power of two
// >= Hq / Hkv), so a GQA-4 model does not pay registers for 8.
// The split workspace (PagedAttentionWorkspaceBytes): per (row, q head,
// split) the partial acc [D] and (max, sum); per (row, kv head) a counter of
// finished splits, left at zero after each launch.
struct SplitWorkspace {
  float* acc;
  float2* ml;
  unsigned* done;
};

// Query row r's token, its context, how many of the launch's `splits` it
// uses (one up to kPagedOneCtaKeys keys, else all; a CTA whose split is past
// them has no keys), its split's keys [kbeg, kend) (the row's context cut in
// that many equal parts) and its sequence's block-table row.
struct SplitKeys {
  int tok, ctx, splits, kbeg, kend;
  const int32_t* bt;
};
__device__ __forceinline__ SplitKeys SplitKeysOf(const PagedAttentionParams& p, int r, int split, int splits) {
  const int seq = p.row_seq[r], ctx = p.ctx_lens[r];
  const int used = ctx <= PagedOneCtaKeys(p) ? 1 : splits;
  const int part = (ctx + used - 1) / used;
  const int kbeg = min(ctx, split * part);
  const int32_t* bt = p.block_tables + static_cast<int64_t>(seq) * (p.bt_stride_ptr ? *p.bt_stride_ptr : p.bt_stride);
  return {p.rows[r], ctx, used, kbeg, min(ctx, kbeg + part), bt};
}

// The CTA's kParts partial softmax states (sm_ml: (max, sum) in log2 units
// per part and query head; sm_acc: their unnormalised O) -> O when the row's
// context is one split; else this split's partials into the workspace, and
// the last split CTA of the (row, kv head) to finish merges them all. Every
// thread of the CTA calls it, after the __syncthreads that publishes the parts.
// One output (query head g, dim d) of the CTA's kParts partial softmax
// states merged: (max, sum) and the unnormalised acc (sum 0: no keys).
struct MergedPart {
  float M, L, A;
};
template <int D, int kG, int kParts>
__device__ __forceinline__ MergedPart MergeParts(const float (&sm_acc)[kParts][kG][D],
                                                 const float2 (&sm_ml)[kParts][kG], int g, int d) {
  float M = -INFINITY;
  for (int k = 0; k < kParts; ++k) M = fmaxf(M, sm_ml[k][g].x);
  float L = 0.0f, A = 0.0f;
  if (M != -INFINITY) {
    for (int k = 0; k < kParts; ++k) {
      const float w = exp2f(sm_ml[k][g].x - M);
      L += sm_ml[k][g].y * w;
      A += sm_acc[k][g][d] * w;
    }
  }
  return {M, L, A};
}

template <typename T, int D, int kG, int kParts>
__device__ __forceinline__ void MergeAndStore(const PagedAttentionParams& p, const SplitWorkspace& ws,
                                              const float (&sm_acc)[kParts][kG][D], const float2 (&sm_ml)[kParts][kG],
                                              int tok, int r, int hk, int split, int splits) {
  const int G = p.Hq / p.Hkv;
  T* O = static_cast<T*>(p.o);
  for (int idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    const MergedPart m = MergeParts(sm_acc, sm_ml, g, d);
    const float M = m.M, L = m.L, A = m.A;
    const int h = hk * G + g;
    if (splits == 1) {
      O[(static_cast<int64_t>(tok) * p.Hq + h) * D + d] = FromFloat<T>(L > 0.0f ? A / L : 0.0f);
    } else {
      const int64_t w = (static_cast<int64_t>(r) * p.Hq + h) * splits + split;
      ws.acc[w * D + d] = A;
      if (d == 0) ws.ml[w] = make_float2(M, L);
    }
  }
  if (splits == 1) return;

  // The last split CTA of this (row, kv head) to finish merges all splits
  // (no separate combine kernel): publish this CTA's partials, count it in
  // (thread 0's fence after the barrier covers the whole CTA's writes, as in
  // a cooperative grid sync).
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = LastBlockToFinish(ws.done + static_cast<int64_t>(r) * p.Hkv + hk, splits);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // One warp per query head: lane s holds split s's (max, sum) (splits <=
  // 32), lane l combines dims l, l + 32, ... Every load is independent, so
  // they go out in as few L2 round trips as 32 registers allow (__ldcg: never
  // a stale L1 line): kMergeBatch splits at a time for all of the lane's
  // dims, the first batch with the (max, sum) loads. At D = 64 that is one
  // round trip for up to 16 splits, where a round trip for the (max, sum) and
  // one for every 32 dims cost ~1 us a layer at B = 16 (dependent batches of
  // 8 splits a slice took 16 at D = 128 and 32 splits: 22 us a layer of the
  // 8B decode step). The sum runs over the splits in order.
  constexpr int kSlices = (D + 31) / 32;
  constexpr int kMergeBatch = 32 / kSlices;
  const int warp = threadIdx.x >> 5, wl = threadIdx.x & 31;
  for (int g = warp; g < G; g += kThreads / 32) {
    const int h = hk * G + g;
    const int64_t base = (static_cast<int64_t>(r) * p.Hq + h) * splits;
    float a[kMergeBatch][kSlices];
    auto load_batch = [&](int s0) {
#pragma unroll
      for (int sp = 0; sp < kMergeBatch; ++sp) {
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl) {
          const int d = 32 * sl + wl;
          a[sp][sl] = s0 + sp < splits && d < D ? __ldcg(ws.acc + (base + s0 + sp) * D + d) : 0.0f;
        }
      }
    };
    const float2 ml = wl < splits ? __ldcg(ws.ml + base + wl) : make_float2(-INFINITY, 0.0f);
    load_batch(0);
    // Every lane takes part in the shuffles, also past D (head dims < 32).
    float M = ml.x;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    const float wgt = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - M);
    float L = ml.y * wgt;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    float A[kSlices] = {};
    for (int s0 = 0; s0 < splits; s0 += kMergeBatch) {
      if (s0 > 0) load_batch(s0);
#pragma unroll
      for (int sp = 0; sp < kMergeBatch; ++sp) {
        const float w = __shfl_sync(0xffffffffu, wgt, (s0 + sp) & 31);
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl) A[sl] = fmaf(w, a[sp][sl], A[sl]);
      }
    }
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl) {
      const int d = 32 * sl + wl;
      if (d < D) O[(static_cast<int64_t>(tok) * p.Hq + h) * D + d] = FromFloat<T>(L > 0.0f ? A[sl] / L : 0.0f);
    }
  }
}

// The same merge when the splits of a (row, kv head) are one thread-block
// cluster (grid x = split): each CTA keeps its merged part in its own shared
// memory, one cluster barrier publishes them, and rank c merges the c-th
// slice of the G x D outputs by reading every rank's part through
// distributed shared memory. No partials in global memory, no fences, no
// counter: at one row the global merge's fence, atomic and L2 round trips
// were most of the attention's time at short contexts. The second barrier
// keeps each CTA's shared memory alive until its peers have read it.
template <typename T, int D, int kG, int kParts>
__device__ __forceinline__ void ClusterMergeAndStore(const PagedAttentionParams& p,
                                                     const float (&sm_acc)[kParts][kG][D],
                                                     const float2 (&sm_ml)[kParts][kG], int tok, int hk) {
  namespace cg = cooperative_groups;
  __shared__ float part_acc[kG][D];
  __shared__ float2 part_ml[kG];
  const int G = p.Hq / p.Hkv;
  for (int idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    const MergedPart m = MergeParts(sm_acc, sm_ml, g, d);
    part_acc[g][d] = m.A;
    if (d == 0) part_ml[g] = make_float2(m.M, m.L);
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int n = static_cast<int>(cluster.num_blocks()), rank = static_cast<int>(cluster.block_rank());
  const int per = (G * D + n - 1) / n;  // a contiguous slice a rank: coalesced O stores
  const int end = min(G * D, (rank + 1) * per);
  for (int idx = rank * per + static_cast<int>(threadIdx.x); idx < end; idx += kThreads) {
    const int g = idx / D, d = idx % D;
    float2 ml[kPagedMaxClusterSplits];
    float a[kPagedMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kPagedMaxClusterSplits; ++s) {  // every load issued before the first use
      ml[s] = s < n ? *cluster.map_shared_rank(&part_ml[g], s) : make_float2(-INFINITY, 0.0f);
      a[s] = s < n ? *cluster.map_shared_rank(&part_acc[g][d], s) : 0.0f;
    }
    float M = -INFINITY;
#pragma unroll
    for (int s = 0; s < kPagedMaxClusterSplits; ++s) M = fmaxf(M, ml[s].x);
    float L = 0.0f, A = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int s = 0; s < kPagedMaxClusterSplits; ++s) {
        const float w = ml[s].x == -INFINITY ? 0.0f : exp2f(ml[s].x - M);
        L += ml[s].y * w;
        A = fmaf(a[s], w, A);
      }
    }
    static_cast<T*>(p.o)[(static_cast<int64_t>(tok) * p.Hq + hk * G + g) * D + d] =
        FromFloat<T>(L > 0.0f ? A / L : 0.0f);
  }
  cluster.sync();
}

template <typename T, int D, int kG>
__global__ void __launch_bounds__(kThreads) PagedAttentionKernel(PagedAttentionParams p, SplitWorkspace ws) {
  constexpr int kLanes = D / 8;               // lanes per key, 8 elements each
  constexpr int kGroups = kThreads / kLanes;  // lane groups per CTA
  constexpr int kU = 4;                       // keys per group per iteration (loads in flight)
  constexpr int kStep = kGroups * kU;         // keys per CTA iteration
  __shared__ float sm_acc[kGroups][kG][D];
  __shared__ float2 sm_ml[kGroups][kG];
  const int r = blockIdx.x, hk = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int G = p.Hq / p.Hkv;
  const SplitKeys sk = SplitKeysOf(p, r, split, splits);  // uploaded before the step: read before the wait
  if (split >= sk.splits) return;                         // a split this row does not use
  PdlEnter();
  const int tok = sk.tok, kbeg = sk.kbeg, kend = sk.kend;
  const int lane = threadIdx.x % kLanes, grp = threadIdx.x / kLanes, d0 = lane * 8;
  const int bs = p.block_size;
  const int32_t* bt = sk.bt;
  const T* Kc = static_cast<const T*>(p.k_cache);
  const T* Vc = static_cast<const T*>(p.v_cache);
  // Element offset of key j's (kv head hk, lane) vector in the cache.
  auto offset_of = [&](int j) -> int64_t {
    if (j >= kend) return -1;
    const int64_t slot = static_cast<int64_t>(bt[j / bs]) * bs + j % bs;
    return (slot * p.Hkv + hk) * D + d0;
  };

  // q pre-scaled by scale * log2(e): the softmax runs in base 2.
  float q[kG][8];
  const float qs = p.scale * kLog2e;
  const T* Q = static_cast<const T*>(p.q);
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g < G) {
      Vec<T, 8> v;
      v.Load(Q + (static_cast<int64_t>(tok) * p.Hq + hk * G + g) * D + d0);
      float f[8];
      v.ToFloats(f);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = f[e] * qs;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = 0.0f;
    }
  }
  float m[kG], l[kG], acc[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }

  // Software pipeline: the block-table lookups of the next iteration are
  // issued while this iteration's K/V loads are in flight.
  int64_t off[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) off[u] = offset_of(kbeg + u * kGroups + grp);
  // Uniform trip count over the CTA: the group shuffles need every lane.
  for (int jb = kbeg; jb < kend; jb += kStep) {
    Vec<T, 8> kv[kU] = {}, vv[kU] = {};
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (off[u] >= 0) {
        kv[u].Load(Kc + off[u]);
        vv[u].Load(Vc + off[u]);
      }
    }
    bool valid[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      valid[u] = off[u] >= 0;
      off[u] = offset_of(jb + kStep + u * kGroups + grp);
    }
    // Scores of the kU keys for every head first, then one rescale per head
    // per iteration (not per key).
    float sc[kU][kG];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float kf[8];
      kv[u].ToFloats(kf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(q[g][e], kf[e], d);
        d = GroupReduce(d, SumOp{}, kLanes);
        sc[u][g] = valid[u] ? d : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      if (g >= G) continue;
      float mn = m[g];
#pragma unroll
      for (int u = 0; u < kU; ++u) mn = fmaxf(mn, sc[u][g]);
      if (mn == -INFINITY) continue;  // no valid key yet
      const float corr = exp2f(m[g] - mn);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
      m[g] = mn;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (!valid[u]) continue;
      float vf[8];
      vv[u].ToFloats(vf);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g >= G) continue;
        const float pr = exp2f(sc[u][g] - m[g]);
        l[g] += pr;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(pr, vf[e], acc[g][e]);
      }
    }
  }

#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (g < G) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sm_acc[grp][g][d0 + e] = acc[g][e];
      if (lane == 0) sm_ml[grp][g] = make_float2(m[g], l[g]);
    }
  }
  __syncthreads();
  MergeAndStore<T, D, kG, kGroups>(p, ws, sm_acc, sm_ml, tok, r, hk, split, sk.splits);
}

// ---- the tensor-core kernel (16-bit K/V, head dims 64 and 128) ----------------
//
// The same work split as PagedAttentionKernel (one CTA per row, kv head and
// context split; four warps, each an online softmax over its own keys, merged
// by MergeAndStore), with both products on mma.sync m16n8k16 instead of
// per-key dot products and shuffles (the CUDA-core kernel's bound at long
// contexts). The G query heads of a kv head are the A rows (padded to 16).
// K and V go straight from global memory to fragments (shared memory holds
// only the warps' partials for the merge), in 16-byte loads: the head
// dimension is permuted so that each lane's fragments come from one load.
//   S = Q K^T, k-step 2s + e (16 dims): lane (g, t) = (lane / 4, lane % 4)
//     holds dims 32s + 8t + 4e + {0, 1} (k positions 2t, 2t + 1) and
//     + {2, 3} (k positions 2t + 8, 2t + 9), of query head g (A) and of key
//     g of the 8-key tile (B): both are words 2e and 2e + 1 of the lane's
//     16-byte load of dims [32s + 8t, 32s + 8t + 8). The order of a dot
//     product's terms does not matter, only that A and B agree.
//   O += P V, k-step of 16 keys = two S tiles: P is the S accumulators (the
//     FlashAttention-2 register reuse); V's fragments come from the same
//     16-byte loads as K's, transposed in registers by movmatrix: output
//     fragment block 4s + w, column pair t, is dims 32s + 8t + 2w + {0, 1},
//     so a lane ends with 8 contiguous dims of its head per s.
template <typename T, int D, bool kCluster>
struct MmaShape {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kSegs = D / 32;  // 16-byte loads per key row and lane
  // 8-key tiles a warp loads per iteration: two (16 keys: four at D = 64 took
  // 134 registers, and a cap of 128 spilled; a B = 1 split of 64 keys keeps
  // all four warps busy). The cluster variant runs at most four rows (256
  // CTAs, two an SM) in at most 16 splits: at D = 64 it takes four tiles, so
  // a split of 128 keys (context 2048) is one iteration, loaded before the
  // programmatic-launch wait.
  static constexpr int kTiles = kCluster && D == 64 ? 4 : 2;
  static constexpr int kKeys = kTiles * 8;  // keys a warp takes per iteration
  static constexpr int kBlocks = D / 8;     // O fragment blocks (8 dims each)
  // CTAs an SM must hold (the register cap): four at D = 64, as many as the
  // CUDA-core kernel, so PagedAttentionSplits' one-wave rule holds (two for
  // the cluster variant); no cap at D = 128 (64 accumulators: ~180
  // registers, two CTAs an SM; a cap of three spilled and lost 3-10% on the
  // H100).
  static constexpr int kMinBlocks = D == 64 ? (kCluster ? 2 : 4) : 1;
};

// kCluster: the splits of a (row, kv head) are one cluster along grid x
// (grid (splits, Hkv, R)) and merge through ClusterMergeAndStore.
template <typename T, int D, int kG, bool kCluster>
__global__ void __launch_bounds__(kThreads, MmaShape<T, D, kCluster>::kMinBlocks)
    PagedAttentionMmaKernel(PagedAttentionParams p, SplitWorkspace ws) {
  using S = MmaShape<T, D, kCluster>;
  constexpr int kWarps = S::kWarps, kSegs = S::kSegs, kTiles = S::kTiles, kKeys = S::kKeys;
  static_assert(kG <= 8, "query heads are the A rows 0-7 (rows 8-15 stay zero)");
  __shared__ float sm_acc[kWarps][kG][D];
  __shared__ float2 sm_ml[kWarps][kG];
  const int r = kCluster ? blockIdx.z : blockIdx.x, hk = blockIdx.y;
  const int split = kCluster ? blockIdx.x : blockIdx.z, splits = kCluster ? gridDim.x : gridDim.z;
  const int G = p.Hq / p.Hkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const SplitKeys sk = SplitKeysOf(p, r, split, splits);  // uploaded before the step: read before the wait
  if (split >= sk.splits) return;                         // a split this row does not use
  const int tok = sk.tok, kbeg = sk.kbeg, kend = sk.kend;
  const int bs = p.block_size;
  const int32_t* bt = sk.bt;
  const T* Kc = static_cast<const T*>(p.k_cache);
  const T* Vc = static_cast<const T*>(p.v_cache);

  // This lane's keys of the iteration at jb, those in [lo, hi), into kr/vr
  // (the others are left as they are).
  uint4 kr[kTiles][kSegs], vr[kTiles][kSegs];
  auto load_keys = [&](int jb, int lo, int hi) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const int j = jb + 8 * i + g;  // the key this lane loads for tile i
      if (j >= lo && j < hi) {
        const int64_t slot = static_cast<int64_t>(bt[j / bs]) * bs + j % bs;
        const int64_t off = (slot * p.Hkv + hk) * D + 8 * t;
#pragma unroll
        for (int s = 0; s < kSegs; ++s) {
          kr[i][s] = __ldg(reinterpret_cast<const uint4*>(Kc + off + 32 * s));
          vr[i][s] = __ldg(reinterpret_cast<const uint4*>(Vc + off + 32 * s));
        }
      }
    }
  };
  auto clear_keys = [&] {
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
#pragma unroll
      for (int s = 0; s < kSegs; ++s) kr[i][s] = vr[i][s] = make_uint4(0u, 0u, 0u, 0u);
  };
  // The first iteration's keys that earlier steps wrote go out before the
  // wait (only_last_key_new: all but ctx - 1); the rest after it.
  const int jb0 = kbeg + warp * kKeys;
  const int early_end = p.only_last_key_new ? min(kend, sk.ctx - 1) : kbeg;
  clear_keys();
  load_keys(jb0, kbeg, early_end);
  PdlEnter();
  load_keys(jb0, early_end, kend);

  // Q as A fragments (rows g < G real, rows 8-15 zero: a[1] = a[3] = 0).
  uint32_t qa[2 * kSegs][2];
  {
    const T* Q = static_cast<const T*>(p.q) + (static_cast<int64_t>(tok) * p.Hq + hk * G + g) * D + 8 * t;
#pragma unroll
    for (int s = 0; s < kSegs; ++s) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (g < G) v = __ldg(reinterpret_cast<const uint4*>(Q + 32 * s));
      qa[2 * s][0] = v.x;
      qa[2 * s][1] = v.y;
      qa[2 * s + 1][0] = v.z;
      qa[2 * s + 1][1] = v.w;
    }
  }
  const float qscale = p.scale * kLog2e;  // softmax in base 2
  float m = -INFINITY, l = 0.0f;          // of head g, over this lane's columns (m: the row's)
  float acc[S::kBlocks][4] = {};

  for (int jb = jb0; jb < kend; jb += kWarps * kKeys) {
    if (jb != jb0) {
      clear_keys();
      load_keys(jb, kbeg, kend);
    }
    // S tiles: c[0], c[1] = head g, keys jb + 8i + 2t, + 1 (c[2], c[3]: rows 8-15).
    float sc[kTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[i][e] = 0.0f;
#pragma unroll
      for (int s = 0; s < kSegs; ++s) {
        const uint32_t a0[4] = {qa[2 * s][0], 0u, qa[2 * s][1], 0u};
        const uint32_t a1[4] = {qa[2 * s + 1][0], 0u, qa[2 * s + 1][1], 0u};
        Mma16816<T>(sc[i], a0, kr[i][s].x, kr[i][s].y);
        Mma16816<T>(sc[i], a1, kr[i][s].z, kr[i][s].w);
      }
    }
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool valid = jb + 8 * i + 2 * t + e < kend;
        sc[i][e] = valid ? sc[i][e] * qscale : -INFINITY;
        mx = fmaxf(mx, sc[i][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mn = fmaxf(m, mx);  // > -inf: the warp's first key of this iteration is valid
    const float corr = exp2f(m - mn);
    m = mn;
    l *= corr;
#pragma unroll
    for (int b = 0; b < S::kBlocks; ++b) {
      acc[b][0] *= corr;
      acc[b][1] *= corr;
    }
    uint32_t pa[kTiles];  // P of tile i, this lane's two keys, as 16-bit pairs
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const float p0 = exp2f(sc[i][0] - mn), p1 = exp2f(sc[i][1] - mn);
      l += p0 + p1;
      pa[i] = Pack2<T>(p0, p1);
    }
    // O += P V, 16 keys (tiles 2q, 2q + 1) a k-step.
#pragma unroll
    for (int q = 0; q < kTiles / 2; ++q) {
      const uint32_t a[4] = {pa[2 * q], 0u, pa[2 * q + 1], 0u};
#pragma unroll
      for (int s = 0; s < kSegs; ++s) {
        const uint32_t w0[4] = {vr[2 * q][s].x, vr[2 * q][s].y, vr[2 * q][s].z, vr[2 * q][s].w};
        const uint32_t w1[4] = {vr[2 * q + 1][s].x, vr[2 * q + 1][s].y, vr[2 * q + 1][s].z, vr[2 * q + 1][s].w};
#pragma unroll
        for (int w = 0; w < 4; ++w) Mma16816<T>(acc[4 * s + w], a, MovMatrixTrans(w0[w]), MovMatrixTrans(w1[w]));
      }
    }
  }

  // This warp's part: head g's (max, sum) and O dims 32s + 8t + [0, 8).
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (g < G) {
#pragma unroll
    for (int s = 0; s < kSegs; ++s) {
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        sm_acc[warp][g][32 * s + 8 * t + 2 * w] = acc[4 * s + w][0];
        sm_acc[warp][g][32 * s + 8 * t + 2 * w + 1] = acc[4 * s + w][1];
      }
    }
    if (t == 0) sm_ml[warp][g] = make_float2(m, l);
  }
  __syncthreads();
  if constexpr (kCluster) {
    // A row of one split stores its output; the cluster kernel never needs
    // the global merge (compiled in, it took 6 more registers and B=1
    // decode steps 2% longer on an H200).
    if (sk.splits > 1) {
      ClusterMergeAndStore<T, D, kG, kWarps>(p, sm_acc, sm_ml, tok, hk);
    } else {
      MergeAndStore<T, D, kG, kWarps>(p, ws, sm_acc, sm_ml, tok, r, hk, 0, 1);
    }
  } else {
    MergeAndStore<T, D, kG, kWarps>(p, ws, sm_acc, sm_ml, tok, r, hk, split, sk.splits);
  }
}

// Whether a launch the tensor-core kernel can run takes it: p.kernel, else
// FUSEDSERVE_PAGED_MMA=0/1, else yes.
bool UseTensorCores(const PagedAttentionParams& p) {
  static const int env = EnvKnob("FUSEDSERVE_PAGED_MMA", 0, 1, -1);
  if (p.kernel >= 0) return p.kernel == 1;
  return env != 0;
}

// The default of PagedAttentionParams::merge: the cluster merge for launches
// of up to this many rows (FUSEDSERVE_PAGED_CLUSTER=n overrides; 0: never).
int ClusterMergeMaxRows() {
  static const int rows = EnvKnob("FUSEDSERVE_PAGED_CLUSTER", 0, 1 << 20, kPagedClusterMaxRows);
  return rows;
}

// Whether the current device co-schedules a cluster of `splits` CTAs of
// kKernel (16 is past the portable 8: allowed per kernel and device).
// Checked once per kernel, device and size; a GPU that cannot falls back to
// the global merge.
template <auto kKernel>
bool ClusterFits(int splits) {
  constexpr int kDevices = 16;
  static std::atomic<int> fits[kDevices][kPagedMaxClusterSplits + 1] = {};  // 0 unknown, 1 yes, -1 no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) {
    cudaGetLastError();
    return false;
  }
  std::atomic<int>& f = fits[device][splits];
  if (f.load(std::memory_order_relaxed) == 0) {
    bool ok = cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(splits), 1, 1);
    cfg.blockDim = dim3(kThreads);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = static_cast<unsigned>(splits);
    attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    ok = ok && cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg) == cudaSuccess && clusters >= 1;
    if (!ok) cudaGetLastError();
    f.store(ok ? 1 : -1, std::memory_order_relaxed);
  }
  return f.load(std::memory_order_relaxed) == 1;
}

template <typename T, int D, int kG>
CudaStatus LaunchPagedTyped(const PagedAttentionParams& p, int splits, void* workspace, cudaStream_t stream) {
  const int64_t slots = static_cast<int64_t>(kPagedMaxSplitRows) * p.Hq;  // (row, head, split) entries
  SplitWorkspace ws;
  ws.acc = static_cast<float*>(workspace);
  ws.ml = reinterpret_cast<float2*>(ws.acc + slots * D);
  ws.done = reinterpret_cast<unsigned*>(ws.ml + slots);
  const dim3 grid(static_cast<unsigned>(p.R), static_cast<unsigned>(p.Hkv), static_cast<unsigned>(splits));
  if constexpr (sizeof(T) == 2 && (D == 64 || D == 128) && kG <= 8) {
    if (UseTensorCores(p)) {
      const bool cluster = (p.merge >= 0 ? p.merge == 1 : p.R <= ClusterMergeMaxRows()) && splits > 1 &&
                           splits <= kPagedMaxClusterSplits && p.R <= 65535 &&
                           ClusterFits<PagedAttentionMmaKernel<T, D, kG, true>>(splits);
      if (cluster) {
        const dim3 cgrid(static_cast<unsigned>(splits), static_cast<unsigned>(p.Hkv), static_cast<unsigned>(p.R));
        return LaunchKernel(PagedAttentionMmaKernel<T, D, kG, true>, cgrid, dim3(kThreads), 0, stream, splits, p, ws);
      }
      return LaunchKernel(PagedAttentionMmaKernel<T, D, kG, false>, grid, dim3(kThreads), 0, stream, 1, p, ws);
    }
  }
  return LaunchKernel(PagedAttentionKernel<T, D, kG>, grid, dim3(kThreads), 0, stream, 1, p, ws);
}

template <typename T, int D>
CudaStatus LaunchPagedGroups(const PagedAttentionParams& p, int splits, void* workspace, cudaStream_t stream) {
  const int G = p.Hq / p.Hkv;
  if (G <= 1) return LaunchPagedTyped<T, D, 1>(p, splits, workspace, stream);
  if (G <= 2) return LaunchPagedTyped<T, D, 2>(p, splits, workspace, stream);
  if (G <= 4) return LaunchPagedTyped<T, D, 4>(p, splits, workspace, stream);
  return LaunchPagedTyped<T, D, kMaxGroup>(p, splits, workspace, stream);
}

}  // namespace

CudaStatus LaunchGatherRows(const void* src, const int32_t* idx, int64_t n, int64_t row_bytes, void* dst,
                            cudaStream_t stream) {
  if (n <= 0) return CudaStatus::Ok();
  const bool vec16 = row_bytes % 16 == 0 && Aligned16(src) && Aligned16(dst);
  return LaunchKernel(GatherRowsKernel, dim3(static_cast<unsigned>(n)), dim3(128), 0, stream, 1,
                      static_cast<const uint8_t*>(src), idx, row_bytes, vec16, static_cast<uint8_t*>(dst));
}

CudaStatus LaunchRopeKvWrite(const RopeKvParams& p, cudaStream_t stream) {
  if (p.T <= 0) return CudaStatus::Ok();
  if (p.D <= 0 || p.D % 2 != 0) return CudaStatus::Unsupported("rope needs an even head dim");
  const int64_t units = p.T * (p.Hq + 2 * p.Hkv) * (p.D / 2);
  CudaStatus st = CudaStatus::Unsupported(std::string("rope_kv_write: unsupported dtype ") + DTypeName(p.dtype));
  DispatchFloatType(p.dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int K = kVec16<T>;
    // The vector kernel: whole 16-byte vectors per half head, every row 16-byte aligned.
    const bool vec = (p.D / 2) % K == 0 && Aligned16(p.qkv) && Aligned16(p.q) && Aligned16(p.k) && Aligned16(p.v) &&
                     Aligned16(p.k_cache) && Aligned16(p.v_cache);
    if (vec) {
      const int per_token = (p.Hq + 2 * p.Hkv) * (p.D / 2 / K);
      const int threads = std::min(256, (per_token + 31) / 32 * 32);
      st = LaunchKernel(RopeKvVecKernel<T>, dim3(static_cast<unsigned>(p.T)), dim3(threads), 0, stream, 1, p);
    } else {
      st = LaunchKernel(RopeKvKernel<T>, dim3(static_cast<unsigned>(CeilDiv(units, 256))), dim3(256), 0, stream, 1, p);
    }
  });
  return st;
}

bool PagedAttentionSupported(int Hq, int Hkv, int D) {
  return Hkv > 0 && Hq % Hkv == 0 && Hq / Hkv <= kMaxGroup && (D == 16 || D == 32 || D == 64 || D == 128);
}

int PagedAttentionSplits(int R, int Hkv, int max_ctx, int sm_count) {
  // One wave: at most as many CTAs as the GPU holds at once (kCtasPerSm per
  // SM, the resident count of the GQA-4 variants: 128 registers a thread),
  // parts of at least ~64 keys, at most kPagedMaxSplits. The earlier rule
  // (about eight CTAs per SM, rounded up) launched 2-3 waves at B >= 16 and
  // paid the split merge where one CTA per (row, kv head) already filled the
  // GPU: measured on the H100 (llama-3.2-1b decode, bench/notes/
  // decode_fusion.md) the attention of B=64 ctx 128 fell from 30 to ~12 us a
  // layer, the step from 1.78 to 1.50 ms. FUSEDSERVE_PAGED_CTAS_PER_SM=n
  // overrides the count.
  constexpr int kCtasPerSm = 4;
  static const int per_sm = EnvKnob("FUSEDSERVE_PAGED_CTAS_PER_SM", 1, 64, kCtasPerSm);
  const int64_t ctas = std::max<int64_t>(1, static_cast<int64_t>(R) * Hkv);
  // With the cluster merge (few rows): at most one cluster's worth (16), and
  // one wave at two CTAs an SM (its D = 64 variant holds three; 12 splits at
  // four rows were slower than 8: clusters of CTAs that start together).
  const bool cluster = R <= ClusterMergeMaxRows();
  const int max_splits = cluster ? kPagedMaxClusterSplits : kPagedMaxSplits;
  const int64_t resident = (cluster ? std::min(per_sm, 2) : per_sm) * static_cast<int64_t>(sm_count);
  int s = static_cast<int>(std::min<int64_t>(max_splits, std::max<int64_t>(1, resident / ctas)));
  s = std::min(s, std::max(1, max_ctx / 64));
  while (s > 1 && static_cast<int64_t>(R) * s > kPagedMaxSplitRows) --s;
  return std::max(s, 1);
}

size_t PagedAttentionWorkspaceBytes(int Hq, int D) {
  const size_t slots = static_cast<size_t>(kPagedMaxSplitRows) * Hq;
  return slots * (static_cast<size_t>(D) * sizeof(float) + sizeof(float2)) +
         static_cast<size_t>(kPagedMaxSplitRows) * Hq * sizeof(unsigned);
}

CudaStatus LaunchPagedAttention(const PagedAttentionParams& p, int splits, void* workspace, cudaStream_t stream) {
  if (p.R <= 0) return CudaStatus::Ok();
  if (!PagedAttentionSupported(p.Hq, p.Hkv, p.D)) {
    return CudaStatus::Unsupported("paged attention: head dim must be 16/32/64/128 and Hq/Hkv <= 8");
  }
  if (splits < 1 || splits > kPagedMaxSplits) return CudaStatus::Error("paged attention: bad split count");
  if (splits > 1 && workspace == nullptr) return CudaStatus::Error("paged attention: splits > 1 needs a workspace");
  static const bool early_kv = EnvKnob("FUSEDSERVE_PAGED_EARLY_KV", 0, 1, 1) != 0;
  PagedAttentionParams q = p;
  q.only_last_key_new = p.only_last_key_new && early_kv;
  CudaStatus st = CudaStatus::Unsupported(std::string("paged attention: unsupported dtype ") + DTypeName(p.dtype));
  DispatchFloatType(p.dtype, [&](auto t) {
    using T = decltype(t);
    switch (p.D) {
      case 16:
        st = LaunchPagedGroups<T, 16>(q, splits, workspace, stream);
        break;
      case 32:
        st = LaunchPagedGroups<T, 32>(q, splits, workspace, stream);
        break;
      case 64:
        st = LaunchPagedGroups<T, 64>(q, splits, workspace, stream);
        break;
      default:
        st = LaunchPagedGroups<T, 128>(q, splits, workspace, stream);
        break;
    }
  });
  return st;
}

}  // namespace fusedserve::cuda
