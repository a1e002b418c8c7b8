// Skinny GEMMs on wgmma + TMA (see kernels/cuda/skinny_hopper.h).
//
// CTA: warpgroup 0 is the producer (one thread issues TMA),
// warpgroups 1 and 2 consume 64 output features each (plain: features
// f0 .. f0+127; SwiGLU: gate features h0 .. h0+63 in warpgroup 1, the
// matching up features in warpgroup 2). Grid (ranks, feature blocks); the
// `ranks` CTAs of a cluster split the K tiles. Per k tile (64 elements, one
// 128-byte swizzle row) a stage holds the CTA's 128 weight rows (two 64-row
// boxes) and the x tile (64 token rows; rows past M are TMA zero fill).
// wgmma m64n64k16: D[feature][token] += W[feature][k] x[token][k].
// Epilogue: every CTA stores its fp32 tile [token][feature] in shared memory
// (padded rows: conflict-free stores from the accumulator layout and
// conflict-free reads), the cluster syncs, and rank r adds up its share of
// the output features over all ranks in rank order, reading peers' shared
// memory, four neighbouring features of a row a thread, then writes them
// (y or h, or the rope and cache rows) with the decode epilogues.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope_kv_epilogue.cuh"
#include "kernels/cuda/skinny_hopper.h"
#include "kernels/cuda/sm90a/hopper.cuh"

namespace fusedserve::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kBK = 64;         // k elements per tile: one 128-byte swizzle row
constexpr int kFeatures = 128;  // weight rows per CTA: two consumer warpgroups x 64
constexpr int kTokens = 64;     // wgmma N: token rows of x (M <= 64)
// 8 stages: 128 KB of weights in flight an SM. H200, 1B decode step at 12 / 16
// rows: 1.016-1.028 ms against 1.046-1.053 with 6 (and a separate fp32
// tile); 9 stages lost (1.050-1.060), probably because the 10 KB of shared
// memory they leave keeps the next kernel's early (PDL) CTAs off the SM.
constexpr int kStages = 8;
constexpr int kThreads = 384;
constexpr int kMaxRanks = 8;                            // cluster size limit (portable)
constexpr int kBoxBytes = 64 * kBK * 2;                 // one 64-row box: 8 KiB
constexpr int kStageBytes = 2 * kBoxBytes + kBoxBytes;  // weights (2 boxes) + x
constexpr int kPartialStride = kFeatures + 4;           // floats per token row of the fp32 tile
constexpr int kPartialBytes = kTokens * kPartialStride * 4;
// The fp32 tile reuses the stages: it is written after the last k tile's
// wgmmas have read them, and no load is in flight by then.
constexpr int kPartialOffset = 0;
static_assert(kPartialBytes <= kStages * kStageBytes, "the fp32 tile fits in the stages");
constexpr int kBarOffset = kStages * kStageBytes;
constexpr int kSmemBytes = kBarOffset + 2 * kStages * 8 + 1024;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory");

__device__ __forceinline__ void FenceAcc(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64]^T, both K-major in shared memory.
template <typename T>
__device__ __forceinline__ void Wgmma64(float (&d)[32], uint64_t a, uint64_t b, int scale_d);
// clang-format off
#define FS_WGMMA_M64N64K16(TYPE)                                                                                   \
  asm volatile(                                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                                            \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"   \
      "%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                            \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),     \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),    \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                  \
      : "l"(a), "l"(b), "r"(scale_d))
template <>
__device__ __forceinline__ void Wgmma64<__nv_bfloat16>(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  FS_WGMMA_M64N64K16("bf16");
}
template <>
__device__ __forceinline__ void Wgmma64<__half>(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  FS_WGMMA_M64N64K16("f16");
}
#undef FS_WGMMA_M64N64K16
// clang-format on

// The sum over the cluster's ranks (in rank order) of partial[e .. e + 3]:
// every rank's 16 bytes loaded before the first add, one round trip over
// the cluster's shared-memory network.
__device__ __forceinline__ void ReduceRanks4(cg::cluster_group& cluster, float* partial, int ranks, int e,
                                             float (&out)[4]) {
  float4 v[kMaxRanks];
#pragma unroll
  for (int r = 0; r < kMaxRanks; ++r) {
    const float* src = r >= ranks ? nullptr : ranks > 1 ? cluster.map_shared_rank(partial, r) : partial;
    v[r] = src != nullptr ? *reinterpret_cast<const float4*>(src + e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  out[0] = out[1] = out[2] = out[3] = 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxRanks; ++r) {
    out[0] += v[r].x;
    out[1] += v[r].y;
    out[2] += v[r].z;
    out[3] += v[r].w;
  }
}

// Elements at .. at + n - 1 (n <= 4) of a row-major tensor; vec: one 8-byte
// Vec access (n == 4, at % 4 == 0 and the base 8-byte aligned: the
// launcher's check). Missing elements read as 0.
template <typename T>
__device__ __forceinline__ void Load4(const T* src, int64_t at, int n, bool vec, float (&out)[4]) {
  if (vec && n == 4) {
    Vec<T, 4> v;
    v.Load(src + at);
    v.ToFloats(out);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = i < n ? ToFloat(src[at + i]) : 0.0f;
}
template <typename T>
__device__ __forceinline__ void Store4(T* dst, int64_t at, int n, bool vec, const float (&in)[4]) {
  if (vec && n == 4) {
    Vec<T, 4> v;
    v.FromFloats(in);
    v.Store(dst + at);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (i < n) dst[at + i] = FromFloat<T>(in[i]);
}

struct SkinnyHopperParams {
  void* y;               // [M, N_out]
  int M, N_out;          // N_out: output features (plain N, SwiGLU I)
  int k_tiles_per_rank;  // K tiles of 64 per cluster rank
  int k_tiles;           // of the whole K
  // The decode epilogues (GemvFusion's meaning; null / false: none). A
  // producer (plain only): y += residual; norm_out = y * norm_next as
  // stored, sq_out[row] += its sum of y^2 (fixed point), sq_clear[row] = 0.
  const void* residual;
  const void* norm_next;
  void* norm_out;
  unsigned long long* sq_out;
  unsigned long long* sq_clear;
  // A consumer (plain or SwiGLU): the products scaled by rsqrt(sum / K + eps).
  const unsigned long long* sq_in;
  float eps, inv_k;
  // The QKV epilogue (plain only; y unused): rope, q and the paged cache rows.
  bool rope_kv;
  GemvRopeKv rope;
  bool vec4;  // N_out % 4 == 0 and y, residual, norm_next, norm_out 8-byte aligned
};

// map_lo / map_hi: the weight rows of consumer warpgroups 1 / 2 (plain: both
// the one weight map, rows f0 and f0 + 64; SwiGLU: the gate and up halves,
// rows h0 in each).
// Registers for two CTAs an SM (85 a thread; the consumers need ~32 for their
// accumulators and no setmaxnreg), though shared memory admits one: the rest
// of the register file lets the next kernel's CTAs, launched early by PDL,
// become resident beside this one (with all 64K registers taken, the norm
// after each projection waited for this kernel's CTAs to exit: +0.7 us each).
template <typename T, bool kSwiglu>
__global__ void __launch_bounds__(kThreads, 2)
    SkinnyHopperKernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_lo,
                       const __grid_constant__ CUtensorMap map_hi, const SkinnyHopperParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  float* const partial = reinterpret_cast<float*>(smem + kPartialOffset);
  const uint32_t full = base + kBarOffset, empty = full + 8 * kStages;

  const int ranks = static_cast<int>(gridDim.x), rank = static_cast<int>(blockIdx.x);
  constexpr int kOutPerCta = kSwiglu ? kFeatures / 2 : kFeatures;
  const int out0 = static_cast<int>(blockIdx.y) * kOutPerCta;  // first output feature of the CTA
  const int kt0 = rank * p.k_tiles_per_rank;
  const int nk = max(0, min(p.k_tiles, kt0 + p.k_tiles_per_rank) - kt0);
  const int row_hi = kSwiglu ? out0 : out0 + 64;  // map_hi's first row (map_lo's: out0)

  __shared__ float rstd_s[kTokens];  // sq_in's rstd of each row
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full + 8 * s, 1);
      MbarInit(empty + 8 * s, 8);  // lane 0 of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    if (threadIdx.x == 0) {
      // The descriptors' first use would otherwise fetch them on the critical path.
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_lo)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_hi)) : "memory");
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_x)) : "memory");
      auto load_weights = [&](int i, int s) {
        const uint32_t w = base + s * kStageBytes;
        TmaLoad2d(w, &map_lo, (kt0 + i) * kBK, out0, full + 8 * s);
        TmaLoad2d(w + kBoxBytes, &map_hi, (kt0 + i) * kBK, row_hi, full + 8 * s);
      };
      auto load_x = [&](int i, int s) {
        TmaLoad2d(base + s * kStageBytes + 2 * kBoxBytes, &map_x, (kt0 + i) * kBK, 0, full + 8 * s);
      };
      // The weights do not depend on the previous kernel: the first stages'
      // weight tiles go out before the PDL wait; x (its output) after it.
      const int pre = min(nk, kStages);
      for (int i = 0; i < pre; ++i) {
        MbarExpectTx(full + 8 * i, kStageBytes);
        load_weights(i, i);
      }
      asm volatile("griddepcontrol.wait;\n" ::: "memory");
      asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
      for (int i = 0; i < pre; ++i) load_x(i, i);
      for (int i = pre; i < nk; ++i) {
        const int s = i % kStages;
        MbarWait(empty + 8 * s, ((i / kStages) & 1) ^ 1);
        MbarExpectTx(full + 8 * s, kStageBytes);
        load_weights(i, s);
        load_x(i, s);
      }
    }
  } else {
    const int cw = wg - 1;
    const int lane = threadIdx.x % 32;
    // A consumer of the previous kernel's row sums takes its rows' rstd now,
    // while the first stages fill (x loads only after the same wait), not
    // in the epilogue (the barrier after the mainloop publishes rstd_s).
    if (p.sq_in != nullptr) {
      asm volatile("griddepcontrol.wait;\n" ::: "memory");
      const int ct = threadIdx.x - 128;
      if (ct < p.M) rstd_s[ct] = rsqrtf(static_cast<float>(__ldcg(p.sq_in + ct)) / kNormSumScale * p.inv_k + p.eps);
    }
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    for (int i = 0; i < nk; ++i) {
      const int s = i % kStages;
      MbarWait(full + 8 * s, (i / kStages) & 1);
      const uint64_t da = SmemDesc(base + s * kStageBytes + cw * kBoxBytes);
      const uint64_t db = SmemDesc(base + s * kStageBytes + 2 * kBoxBytes);
      FenceAcc(acc);
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < kBK / 16; ++k) Wgmma64<T>(acc, da + 2 * k, db + 2 * k, 1);
      WgmmaCommit();
      FenceAcc(acc);
      WgmmaWait<1>();  // tile i - 1's wgmmas are done: its stage goes back
      if (i > 0 && lane == 0) MbarArrive(empty + 8 * ((i - 1) % kStages));
    }
    WgmmaWait<0>();
    FenceAcc(acc);
    // The fp32 tile overwrites the stages: both warpgroups' wgmmas are done.
    asm volatile("bar.sync 2, 256;" ::: "memory");
    // Accumulator 4j + e: feature (warp % 4) * 16 + lane / 4 (+8 for e >= 2)
    // of this warpgroup, token 8j + 2 (lane % 4) (+1 for odd e).
    const int warp = (threadIdx.x / 32) % 4;
    const int f = cw * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = 8 * j + 2 * (lane % 4) + (e & 1);
        partial[tok * kPartialStride + f + (e >= 2 ? 8 : 0)] = acc[4 * j + e];
      }
    }
  }

  // Rank r adds up output features [r * per, (r + 1) * per) of the CTA over
  // all ranks (rank order), for every token row, and writes them: the
  // consumer warpgroups (the producer's takes part in the barriers only).
  cg::cluster_group cluster = cg::this_cluster();
  if (ranks > 1) {
    cluster.sync();
  } else {
    __syncthreads();
  }
  if (wg > 0) {
    // The epilogue's operands (the residual, a producer's sums, positions)
    // come from earlier kernels: wait for them as the producer did (free by
    // now, after every tile's x).
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    const int ct = threadIdx.x - 128;  // consumer thread 0..255
    // Rank r's share of the CTA's output features: a multiple of four, so a
    // thread takes four neighbours (one 16-byte load a rank, two rope pairs).
    const int per = ((kOutPerCta + ranks - 1) / ranks + 3) & ~3;
    const int f_begin = rank * per, n_f = max(0, min(per, kOutPerCta - f_begin));
    const int n_quads = (n_f + 3) / 4;
    // A token row's quads lie in q_pad (a power of two <= 32) neighbouring
    // lanes of one warp, so the row's sum of y^2 is added up by shuffles and
    // leaves in one atomic. Every (row, quad) of the rank is one thread's:
    // their loads (all ranks' partials, residual, norm weight) go out at
    // once, one round trip for the rank's whole share at M <= 64 rows and
    // 16-32 features. (A warp a row, rows one after another: at 64 rows on
    // the H200 the fused down took 17.8 us, o_proj 10.2, QKV + rope 10.4;
    // this way 14.7, 7.5 and 8.8, CUPTI critical path.)
    int q_log = 0;
    while ((1 << q_log) < n_quads) ++q_log;
    const int q_pad = 1 << q_log, total = p.M << q_log;
    const int cwarp = ct / 32, lane = ct % 32;
    T* const y = static_cast<T*>(p.y);
    for (int warp_base = cwarp * 32; warp_base < total; warp_base += kThreads - 128) {  // warp-uniform
      const int idx = warp_base + lane, tok = idx >> q_log, q = idx & (q_pad - 1);
      const int fl = f_begin + 4 * q, fo = out0 + fl;
      // Features of the quad that exist (0 for the padding lanes).
      const int valid = idx < total && q < n_quads ? max(0, min(4, min(n_f - 4 * q, p.N_out - fo))) : 0;
      float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      unsigned long long sq = 0;
      if (valid > 0) {
        const int e = tok * kPartialStride + fl;
        ReduceRanks4(cluster, partial, ranks, e, a);
        const float r = p.sq_in != nullptr ? rstd_s[tok] : 1.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] *= r;
        const int64_t at = static_cast<int64_t>(tok) * p.N_out + fo;
        if constexpr (kSwiglu) {
          float u[4];
          ReduceRanks4(cluster, partial, ranks, e + 64, u);
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = a[i] / (1.0f + __expf(-a[i])) * (u[i] * r);
          Store4(y, at, valid, p.vec4, a);
        } else if (p.rope_kv) {
          const int slot = p.rope.slots != nullptr ? p.rope.slots[tok] : -1;
          const int pos = p.rope.positions[tok];
          for (int i = 0; i + 1 < valid; i += 2)
            RopeKvStorePair<T>(p.rope, a[i], a[i + 1], fo + i, tok, RopeKvCosSin(p.rope, fo + i, pos), slot);
        } else {
          if (p.residual != nullptr) {
            float res[4];
            Load4(static_cast<const T*>(p.residual), at, valid, p.vec4, res);
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] += res[i];
          }
          // The next norm sees the values as stored.
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = ToFloat(FromFloat<T>(a[i]));
          Store4(y, at, valid, p.vec4, a);
          if (p.norm_out != nullptr) {
            float w[4];
            Load4(static_cast<const T*>(p.norm_next), fo, valid, p.vec4, w);
            float n[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              n[i] = a[i] * w[i];
              if (i < valid) sq += static_cast<unsigned long long>(__float2ull_rn(a[i] * a[i] * kNormSumScale));
            }
            Store4(static_cast<T*>(p.norm_out), at, valid, p.vec4, n);
          }
        }
      }
      if (!kSwiglu && p.sq_out != nullptr) {  // integer adds: the same sum in any order
        for (int o = q_pad / 2; o > 0; o /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (q == 0 && sq != 0) atomicAdd(p.sq_out + tok, sq);
      }
    }
    if (!kSwiglu && p.sq_clear != nullptr && rank == 0 && blockIdx.y == 0 && ct < p.M) p.sq_clear[ct] = 0;
  }
  if (ranks > 1) cluster.sync();  // peers may still read this CTA's tile
}

// ---- host side ----------------------------------------------------------------

// [rows, cols] in 64 x 64 boxes (kBK columns: one swizzle row).
CudaStatus MakeMap(CUtensorMap* map, DType dt, const void* ptr, int64_t rows, int64_t cols) {
  static_assert(kBK == 64, "EncodeRowMajorMap's boxes are 64 columns wide");
  return EncodeRowMajorMap(map, dt, ptr, rows, cols, 64, "skinny_hopper");
}

// MaxActiveClusters of `kernel` at `ranks`, queried once per device, kernel and size.
template <typename Kernel>
CudaStatus CachedMaxActiveClusters(Kernel kernel, int ranks, int* fit) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> cache;
  int dev = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&dev)); !s.ok()) return s;
  const auto key = std::make_tuple(dev, reinterpret_cast<const void*>(kernel), ranks);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    int n = 0;
    if (CudaStatus s = MaxActiveClusters(kernel, ranks, kThreads, kSmemBytes, &n); !s.ok()) return s;
    it = cache.emplace(key, n).first;
  }
  *fit = it->second;
  return CudaStatus::Ok();
}

template <typename T, bool kSwiglu>
CudaStatus Launch(const CUtensorMap& mx, const CUtensorMap& mlo, const CUtensorMap& mhi, int64_t M, int64_t N_out,
                  int64_t K, void* y, const GemvFusion& f, cudaStream_t stream) {
  auto kernel = SkinnyHopperKernel<T, kSwiglu>;
  if (CudaStatus s =
          FS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
      !s.ok())
    return s;
  const int sms = HopperDeviceInfo() >> 1;
  const int64_t out_per_cta = kSwiglu ? kFeatures / 2 : kFeatures;
  const int64_t blocks = (N_out + out_per_cta - 1) / out_per_cta;
  if (blocks > 65535) return CudaStatus::Error("skinny_hopper: too many output features");
  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
  // Split K over a cluster when the output alone leaves SMs idle (a
  // 2048-wide output is 16 CTAs): the most ranks (<= 8, the portable size,
  // any count: 7 fits two clusters in each 16-18 SM GPC) whose clusters all
  // fit at once and the CTAs in one wave, with >= 2 k tiles a rank. Clusters
  // that do not fit would run as a second wave (measured: o_proj M=64 in 16
  // clusters of 8 took 2x, 15 fit).
  int ranks = 1;
  for (int r = kMaxRanks; r >= 2 && blocks < sms; --r) {
    if (blocks * r > sms || k_tiles < 2 * r) continue;
    int fit = 0;
    if (CudaStatus s = CachedMaxActiveClusters(kernel, r, &fit); !s.ok()) return s;
    if (blocks <= fit) {
      ranks = r;
      break;
    }
  }
  const int per_rank = (k_tiles + ranks - 1) / ranks;
  SkinnyHopperParams hp{};
  hp.y = y;
  hp.M = static_cast<int>(M);
  hp.N_out = static_cast<int>(N_out);
  hp.k_tiles_per_rank = per_rank;
  hp.k_tiles = k_tiles;
  hp.residual = f.residual;
  hp.norm_next = f.norm_next;
  hp.norm_out = f.norm_out;
  hp.sq_out = f.sq_out;
  hp.sq_clear = f.sq_clear;
  hp.sq_in = f.sq_in;
  hp.eps = f.eps;
  hp.inv_k = 1.0f / static_cast<float>(K);
  hp.rope_kv = f.rope_kv;
  hp.rope = f.rope;
  auto aligned8 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 8 == 0; };
  hp.vec4 = N_out % 4 == 0 && aligned8(y) && aligned8(f.residual) && aligned8(f.norm_next) && aligned8(f.norm_out);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ranks), static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = static_cast<unsigned>(ranks);
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return FS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mx, mlo, mhi, hp));
}

template <bool kSwiglu>
CudaStatus LaunchDtype(DType dt, const CUtensorMap& mx, const CUtensorMap& mlo, const CUtensorMap& mhi, int64_t M,
                       int64_t N_out, int64_t K, void* y, cudaStream_t stream, const GemvFusion& f = GemvFusion{}) {
  return dt == DType::kBF16 ? Launch<__nv_bfloat16, kSwiglu>(mx, mlo, mhi, M, N_out, K, y, f, stream)
                            : Launch<__half, kSwiglu>(mx, mlo, mhi, M, N_out, K, y, f, stream);
}

}  // namespace

bool SkinnyHopperAvailable() { return (HopperDeviceInfo() & 1) != 0; }

bool SkinnyHopperOneWave(int64_t N, bool swiglu) {
  const int64_t out_per_cta = swiglu ? kFeatures / 2 : kFeatures;
  return (N + out_per_cta - 1) / out_per_cta <= (HopperDeviceInfo() >> 1);
}

bool SkinnyHopperSupported(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && M >= 1 && M <= kSkinnyHopperMaxM && N >= 1 &&
         N < (int64_t{1} << 30) && K >= 8 && K % 8 == 0 && K < (int64_t{1} << 30) && Aligned16(x) && Aligned16(w) &&
         SkinnyHopperAvailable();
}

CudaStatus LaunchSkinnyHopper(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                              cudaStream_t stream) {
  if (!SkinnyHopperSupported(dtype, M, N, K, x, w) || !Aligned16(y)) {
    return CudaStatus::Unsupported("skinny_hopper: needs compute capability 9.0, bf16/fp16, M <= 64, K % 8 == 0");
  }
  CUtensorMap mx, mw;
  if (CudaStatus s = MakeMap(&mx, dtype, x, M, K); !s.ok()) return s;
  if (CudaStatus s = MakeMap(&mw, dtype, w, N, K); !s.ok()) return s;
  return LaunchDtype<false>(dtype, mx, mw, mw, M, N, K, y, stream);
}

CudaStatus LaunchSkinnyHopperFused(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                                   const GemvFusion& f, cudaStream_t stream) {
  if (!SkinnyHopperSupported(dtype, M, N, K, x, w) || !Aligned16(y)) {
    return CudaStatus::Unsupported("skinny_hopper: needs compute capability 9.0, bf16/fp16, M <= 64, K % 8 == 0");
  }
  if (f.norm_weight != nullptr || !f.NormNextConsistent() || !f.EpiloguesCombine())
    return CudaStatus::Unsupported("skinny_hopper: a producer's epilogue, a consumer's sums or rope, no folded norm");
  if (f.rope_kv && !f.rope.ShapeFits(N, 2)) return CudaStatus::Unsupported("skinny_hopper: rope epilogue shape");
  if (f.rope_kv && !f.rope.TensorsPresent()) return CudaStatus::Error("skinny_hopper: rope epilogue tensor missing");
  if (!f.rope_kv && y == nullptr) return CudaStatus::Error("skinny_hopper: no output");
  CUtensorMap mx, mw;
  if (CudaStatus s = MakeMap(&mx, dtype, x, M, K); !s.ok()) return s;
  if (CudaStatus s = MakeMap(&mw, dtype, w, N, K); !s.ok()) return s;
  return LaunchDtype<false>(dtype, mx, mw, mw, M, N, K, y, stream, f);
}

CudaStatus LaunchSkinnyHopperSwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                    void* h, cudaStream_t stream, const GemvFusion& f) {
  if (!SkinnyHopperSupported(dtype, M, I, D, x, gate_up) || !Aligned16(h)) {
    return CudaStatus::Unsupported("skinny_hopper: needs compute capability 9.0, bf16/fp16, M <= 64, D % 8 == 0");
  }
  if (!f.OnlyConsumerSums()) return CudaStatus::Unsupported("skinny_hopper SwiGLU: only a producer's sums");
  CUtensorMap mx, mg, mu;
  if (CudaStatus s = MakeMap(&mx, dtype, x, M, D); !s.ok()) return s;
  if (CudaStatus s = MakeMap(&mg, dtype, gate_up, I, D); !s.ok()) return s;
  const void* up = static_cast<const uint8_t*>(gate_up) + static_cast<size_t>(I) * D * 2;
  if (CudaStatus s = MakeMap(&mu, dtype, up, I, D); !s.ok()) return s;
  return LaunchDtype<true>(dtype, mx, mg, mu, M, I, D, h, stream, f);
}

}  // namespace fusedserve::cuda
