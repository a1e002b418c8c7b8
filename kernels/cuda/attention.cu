// Attention kernels (see attention.h). Kernel versions:
//   FlashFwdKernel (prefill, bf16/fp16): a CTA owns kWarps*16*kMTiles query
//     rows of one (sequence, q head); with one m-tile per warp Q stays in
//     registers as mma A fragments, with two it is re-read from shared memory
//     and each K/V fragment feeds two MMAs (half the ldmatrix traffic per
//     MMA, the FlashAttention-2 layout). It streams 64-key K/V tiles
//     (double-buffered cp.async into XOR-swizzled shared memory, ldmatrix
//     out of it at precomputed per-lane addresses), computes
//     S = Q K^T with mma.sync m16n8k16 (fp32 accumulators), applies the causal
//     / length mask only on tiles that need it, does the online softmax in
//     registers (exp2 with the scale folded in), reuses the S accumulators as
//     the A fragments of P and accumulates O += P V on tensor cores. Warps
//     whose rows lie entirely above a causal tile skip it; O is rescaled only
//     when some row's max moved. Heavy (late) query blocks are launched first.
//     mma.sync, not wgmma: this file builds for sm_90 (and older GPUs); the
//     wgmma kernel is kernels/cuda/sm90a/attention_hopper.cu, picked at run
//     time on compute capability 9.0 (this one stays the fallback).
//   SimtAttnKernel (decode, all dtypes; fp32 prefill): a CTA owns G q heads
//     that share one kv head, for one query and one split of its keys. Lanes
//     hold 16-byte slices of a key row (D/8 lanes per row for 16-bit types),
//     so a warp reads whole rows coalesced, through a private 3-stage
//     cp.async ring in shared memory; each warp runs its own online
//     softmax over its keys and the CTA merges the warps at the end. With
//     splits > 1 the CTA writes (unnormalized O, max, sum) and
//     CombineSplitsKernel merges the splits (flash-decoding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_hopper.h"
#include "kernels/cuda/common.cuh"

namespace fusedserve::cuda {
namespace {

using cuda::FastExp2;   // softmax exp and varlen offsets (common.cuh)
using cuda::FromFloat;  // shared dtype conversions (common.cuh)
using cuda::Mma16816;   // tensor-core tile (common.cuh)
using cuda::Pack2;
using cuda::SequenceStart;
using cuda::ToFloat;

constexpr float kLog2e = 1.4426950408889634f;

// ============================================================================
// Tensor-core flash attention (prefill).
// ============================================================================

struct FlashParams {
  const void* q;            // [T,Hq,D]
  const void* k;            // [T,Hkv,D]
  const void* v;            // [T,Hkv,D]
  void* o;                  // [T,Hq,D]
  const int32_t* seq_lens;  // [B]
  int Hq, Hkv, group;       // group = Hq / Hkv
  float scale_log2;         // scale * log2(e)
  bool causal;
};

template <typename T, int kHeadDim, int kWarps, int kMTiles>
struct FlashTraits {
  static constexpr int kWarpRows = 16 * kMTiles;      // query rows per warp
  static constexpr int kBlockM = kWarps * kWarpRows;  // query rows per CTA
  static constexpr int kBlockN = 64;                  // keys per tile
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kQElems = kBlockM * kHeadDim;
  static constexpr int kKVElems = kBlockN * kHeadDim;
  // Q, then K and V with two stages each.
  static constexpr int kSmemBytes = (kQElems + 4 * kKVElems) * static_cast<int>(sizeof(T));
  // One m-tile per warp: Q lives in registers (32 regs at D=128). Two: the
  // accumulators need the registers, Q is re-read from shared memory.
  static constexpr bool kQInRegs = kMTiles == 1;
  static_assert(sizeof(T) == 2, "tensor-core path is 16-bit only");
  static_assert(kChunks % 8 == 0, "the XOR swizzle needs rows of a multiple of 128 bytes");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "mma tiles");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// Element offset of 16-byte chunk c of row r in a swizzled [rows, kChunks*8]
// tile: chunk c lands at c ^ (r % 8), so the 8 rows an ldmatrix reads hit 8
// different bank groups.
template <int kChunks>
__device__ __forceinline__ int SwizzledOffset(int r, int c) {
  return r * kChunks * 8 + ((c ^ (r & 7)) << 3);
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Copies rows [row0, row0 + kRows) of a [*, stride] matrix (rows >= limit
// zero-filled) into a swizzled shared tile. Each thread owns one chunk column
// and every kRowStep-th row; kRowStep is a multiple of 8, so its swizzled
// chunk is the same in every pass and the loop unrolls to plain offsets.
template <typename T, int kRows, int kChunks, int kThreads>
__device__ __forceinline__ void LoadTile(T* __restrict__ smem, const T* __restrict__ gmem, int64_t stride, int row0,
                                         int limit) {
  constexpr int kRowStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kRowStep % 8 == 0 && kRows % kRowStep == 0, "tile load shape");
  const int c = threadIdx.x % kChunks, r = threadIdx.x / kChunks;
  T* dst = smem + SwizzledOffset<kChunks>(r, c);
  const T* src = gmem + (row0 + r) * stride + c * 8;
#pragma unroll
  for (int it = 0; it < kRows / kRowStep; ++it) {
    const bool valid = row0 + r + it * kRowStep < limit;
    CpAsync16(dst + it * kRowStep * kChunks * 8, valid ? src + it * kRowStep * stride : gmem, valid);
  }
}

template <typename T, int kHeadDim, int kWarps, int kMTiles>
__global__ void __launch_bounds__(kWarps * 32, 1) FlashFwdKernel(FlashParams p) {
  using Tr = FlashTraits<T, kHeadDim, kWarps, kMTiles>;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kChunks = Tr::kChunks;
  constexpr int kDTiles = kHeadDim / 8;   // n8 tiles of O
  constexpr int kNTiles = kBlockN / 8;    // n8 tiles of S
  constexpr int kDSteps = kHeadDim / 16;  // k16 steps of Q K^T
  extern __shared__ uint4 smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + Tr::kQElems;       // 2 stages
  T* sV = sK + 2 * Tr::kKVElems;  // 2 stages

  const int b = blockIdx.z, h = blockIdx.y;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // heaviest causal blocks first
  const int seqlen = p.seq_lens[b];
  if (m_block * kBlockM >= seqlen) return;
  const int seq_start = SequenceStart(p.seq_lens, b);
  const int kvh = h / p.group;
  const int64_t q_stride = static_cast<int64_t>(p.Hq) * kHeadDim;
  const int64_t kv_stride = static_cast<int64_t>(p.Hkv) * kHeadDim;
  const T* gQ = static_cast<const T*>(p.q) + seq_start * q_stride + h * kHeadDim;
  const T* gK = static_cast<const T*>(p.k) + seq_start * kv_stride + kvh * kHeadDim;
  const T* gV = static_cast<const T*>(p.v) + seq_start * kv_stride + kvh * kHeadDim;
  T* gO = static_cast<T*>(p.o) + seq_start * q_stride + h * kHeadDim;

  const int n_blocks = p.causal
                           ? min((seqlen + kBlockN - 1) / kBlockN, ((m_block + 1) * kBlockM + kBlockN - 1) / kBlockN)
                           : (seqlen + kBlockN - 1) / kBlockN;

  LoadTile<T, kBlockM, kChunks, Tr::kThreads>(sQ, gQ, q_stride, m_block * kBlockM, seqlen);
  LoadTile<T, kBlockN, kChunks, Tr::kThreads>(sK, gK, kv_stride, 0, seqlen);
  LoadTile<T, kBlockN, kChunks, Tr::kThreads>(sV, gV, kv_stride, 0, seqlen);
  CpAsyncCommit();
  CpAsyncWaitAll();
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warp_row0 = warp * Tr::kWarpRows;  // first row of this warp within the block
  // ldmatrix addresses. Every row a lane addresses is congruent to lane mod 8,
  // so its swizzled chunk is (logical chunk) ^ (lane & 7):
  //   Q (A, rows warp_row0 + 16 mt + lane % 16, chunk 2 kk + lane / 16),
  //   K (B, rows 16 np + lane % 8 + 8 (lane / 16), chunk 2 kk + (lane / 8) % 2),
  //   V (B^T, rows 16 j + lane % 16, chunk 2 dp + lane / 16).
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kKVBytes = Tr::kKVElems * 2;
  const uint32_t q_lane = SmemAddr(sQ) + (warp_row0 + (lane & 15)) * kRowBytes;
  const uint32_t k_lane = SmemAddr(sK) + ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes;
  const uint32_t v_lane = SmemAddr(sV) + (lane & 15) * kRowBytes;
  const uint32_t qv_y = (lane >> 4) ^ (lane & 7);
  const uint32_t k_y = ((lane >> 3) & 1) ^ (lane & 7);
  uint32_t qf[Tr::kQInRegs ? kDSteps : 1][4];
  if constexpr (Tr::kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < kDSteps; ++kk) LdMatrixX4(qf[kk], q_lane + (((2 * kk) ^ qv_y) << 4));
  }

  float o[kMTiles][kDTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  }
  float row_max[kMTiles][2], row_sum[kMTiles][2];  // max in log2 units; sum over this thread's columns
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  const int warp_row_min = m_block * kBlockM + warp_row0;
  const int warp_row_max = warp_row_min + Tr::kWarpRows - 1;
  const int row_a = warp_row_min + (lane >> 2);  // m-tile mt: rows row_a + 16 mt and + 8
  const float scale_log2 = p.scale_log2;

  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb & 1;
    if (nb + 1 < n_blocks) {
      LoadTile<T, kBlockN, kChunks, Tr::kThreads>(sK + (stage ^ 1) * Tr::kKVElems, gK, kv_stride, (nb + 1) * kBlockN,
                                                  seqlen);
      LoadTile<T, kBlockN, kChunks, Tr::kThreads>(sV + (stage ^ 1) * Tr::kKVElems, gV, kv_stride, (nb + 1) * kBlockN,
                                                  seqlen);
      CpAsyncCommit();
    }
    const int key0 = nb * kBlockN;
    if (!(p.causal && key0 > warp_row_max)) {  // else every key of the tile is masked for this warp
      const uint32_t k_tile = k_lane + stage * kKVBytes;
      const uint32_t v_tile = v_lane + stage * kKVBytes;
      float s[kMTiles][kNTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int i = 0; i < kNTiles; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < kDSteps; ++kk) {
        uint32_t qa[kMTiles][4];
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[0][i] = qf[kk][i];
        } else {
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            LdMatrixX4(qa[mt], q_lane + mt * 16 * kRowBytes + (((2 * kk) ^ qv_y) << 4));
          }
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t kb[4];
          LdMatrixX4(kb, k_tile + np * 16 * kRowBytes + (((2 * kk) ^ k_y) << 4));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            Mma16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
            Mma16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
          }
        }
      }
      // Mask keys past the sequence and, for causal, keys after the query.
      if (key0 + kBlockN > seqlen || (p.causal && key0 + kBlockN - 1 > warp_row_min)) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = key0 + nt * 8 + 2 * (lane & 3) + (e & 1);
              const int row = row_a + mt * 16 + (e >> 1) * 8;
              if (col >= seqlen || (p.causal && col > row)) s[mt][nt][e] = -INFINITY;
            }
          }
        }
      }
      // Online softmax; each row's 64 columns are spread over a quad of lanes.
      float alphas[kMTiles][2];
      bool rescale = false;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(row_max[mt][half], mx * scale_log2);
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // fully masked so far: p = 0, no NaN
          const float alpha = FastExp2(row_max[mt][half] - m_use);
          row_max[mt][half] = m_new;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            s[mt][nt][2 * half] = FastExp2(fmaf(s[mt][nt][2 * half], scale_log2, -m_use));
            s[mt][nt][2 * half + 1] = FastExp2(fmaf(s[mt][nt][2 * half + 1], scale_log2, -m_use));
            sum += s[mt][nt][2 * half] + s[mt][nt][2 * half + 1];
          }
          row_sum[mt][half] = row_sum[mt][half] * alpha + sum;
          alphas[mt][half] = alpha;
          rescale |= alpha != 1.0f;
        }
      }
      // Once the running maxima settle, most tiles leave every row's max
      // unchanged: skip the kMTiles * kHeadDim / 2 multiplies then.
      if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int dt = 0; dt < kDTiles; ++dt) {
            o[mt][dt][0] *= alphas[mt][0];
            o[mt][dt][1] *= alphas[mt][0];
            o[mt][dt][2] *= alphas[mt][1];
            o[mt][dt][3] *= alphas[mt][1];
          }
        }
      }
      // O += P V: the S accumulators of n-tiles 2j, 2j+1 are the A fragment of k-step j.
#pragma unroll
      for (int j = 0; j < kBlockN / 16; ++j) {
        uint32_t pa[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          pa[mt][0] = Pack2<T>(s[mt][2 * j][0], s[mt][2 * j][1]);
          pa[mt][1] = Pack2<T>(s[mt][2 * j][2], s[mt][2 * j][3]);
          pa[mt][2] = Pack2<T>(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
          pa[mt][3] = Pack2<T>(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t vb[4];
          LdMatrixX4Trans(vb, v_tile + j * 16 * kRowBytes + (((2 * dp) ^ qv_y) << 4));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            Mma16816<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
            Mma16816<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
          }
        }
      }
    }
    CpAsyncWaitAll();
    __syncthreads();
  }

  // Normalize and store (rows past the sequence are not written).
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[mt][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int row = row_a + mt * 16 + half * 8;
      if (row < seqlen) {
        T* out = gO + row * q_stride + 2 * (lane & 3);
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          *reinterpret_cast<uint32_t*>(out + dt * 8) =
              Pack2<T>(o[mt][dt][2 * half] * inv, o[mt][dt][2 * half + 1] * inv);
        }
      }
    }
  }
}

template <typename T, int kHeadDim, int kWarps, int kMTiles>
CudaStatus LaunchFlash(const AttentionParams& a, cudaStream_t stream) {
  using Tr = FlashTraits<T, kHeadDim, kWarps, kMTiles>;
  auto kernel = FlashFwdKernel<T, kHeadDim, kWarps, kMTiles>;
  if (CudaStatus s =
          FS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
      !s.ok())
    return s;
  // All of L1 as shared memory, so two 96 KB CTAs fit on an SM.
  if (CudaStatus s = FS_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
      !s.ok())
    return s;
  FlashParams p{a.q, a.k, a.v, a.o, a.seq_lens, a.Hq, a.Hkv, a.Hq / a.Hkv, a.scale * kLog2e, a.causal};
  const dim3 grid((a.max_seqlen + Tr::kBlockM - 1) / Tr::kBlockM, a.Hq, a.B);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return FS_CUDA_CHECK_LAUNCH();
}

template <typename T, int kHeadDim>
CudaStatus LaunchFlashHD(const AttentionParams& a, int block_m, int warps, cudaStream_t stream) {
  if (block_m == 128 && warps == 4) return LaunchFlash<T, kHeadDim, 4, 2>(a, stream);
  if (block_m == 64 && warps == 4) return LaunchFlash<T, kHeadDim, 4, 1>(a, stream);
  if (block_m == 128 && warps == 8) return LaunchFlash<T, kHeadDim, 8, 1>(a, stream);
  return CudaStatus::Error("attention: no prefill kernel with " + std::to_string(block_m) + " rows and " +
                           std::to_string(warps) + " warps");
}

template <typename T>
CudaStatus LaunchFlashDtype(const AttentionParams& a, int block_m, int warps, cudaStream_t stream) {
  return a.D == 128 ? LaunchFlashHD<T, 128>(a, block_m, warps, stream)
                    : LaunchFlashHD<T, 64>(a, block_m, warps, stream);
}

// ============================================================================
// SIMT attention: decode (every dtype) and fp32 prefill.
// ============================================================================

constexpr int kSimtWarps = 4;
constexpr int kMinKeysPerSplit = 64;

struct SimtParams {
  const void* q;  // decode [B,Hq,D]; prefill [T,Hq,D]
  const void* k;  // decode [B,L,Hkv,D]; prefill [T,Hkv,D]
  const void* v;
  void* o;              // like q
  float* part_o;        // [Q,Hq,splits,D] unnormalized partial outputs (splits > 1)
  float* part_ml;       // [Q,Hq,splits,2] (max in log2 units, sum)
  const int32_t* lens;  // decode: lengths [B]; prefill: seq_lens [B]
  int L;                // decode: cache rows per sequence
  int Hq, Hkv, group;   // group = Hq / Hkv
  int splits, keys_per_split;
  float scale_log2;
  bool prefill, causal;
};

// Each warp streams its keys through a private ring of kStages shared-memory
// stages with cp.async: every lane copies, and later reads back, its own
// 16-byte slices, so the ring needs no barriers, and kStages - 1 tiles of
// K/V are in flight per warp while it computes on one (measured: with loads
// into registers, one tile in flight, B=16 L=4096 reached 90% of copy
// bandwidth). kU slices per lane per tile.
constexpr int kSimtU = 4;
constexpr int kSimtStages = 3;
// Ring bytes per CTA: warps x stages x (K, V) x 32 lanes x kU x 16 bytes (48 KB).
constexpr int kSimtRingBytes = kSimtWarps * kSimtStages * 2 * 32 * kSimtU * 16;

template <typename T, int kHeadDim, int kG>
__global__ void __launch_bounds__(kSimtWarps * 32, 4) SimtAttnKernel(SimtParams p) {
  constexpr int kVec = 16 / sizeof(T);             // elements per 16-byte slice
  constexpr int kLanesPerKey = kHeadDim / kVec;    // lanes sharing one key row
  constexpr int kKeysPerLoad = 32 / kLanesPerKey;  // key rows per warp load
  constexpr int kU = kSimtU;
  constexpr int kKeysPerIter = kKeysPerLoad * kU;
  static_assert(kLanesPerKey <= 32 && 32 % kLanesPerKey == 0, "head dim / vector width");
  static_assert(kSimtWarps * kG * (kHeadDim + 2) * 4 <= kSimtRingBytes, "merge buffer reuses the ring");
  extern __shared__ uint4 ring[];  // [warp][stage][K|V][u][lane] 16-byte slices

  const int qi = blockIdx.z;       // query (decode: sequence; prefill: token)
  const int h0 = blockIdx.y * kG;  // first q head; all kG share kv head h0 / group
  const int kvh = h0 / p.group;
  const int split = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = lane / kLanesPerKey, dl = lane % kLanesPerKey;
  const int64_t kv_stride = static_cast<int64_t>(p.Hkv) * kHeadDim;

  int len;
  int64_t kv_row0;
  if (p.prefill) {
    int start = 0, b = 0;
    while (qi >= start + p.lens[b]) start += p.lens[b++];
    len = p.causal ? qi - start + 1 : p.lens[b];
    kv_row0 = start;
  } else {
    len = min(p.lens[qi], p.L);
    kv_row0 = static_cast<int64_t>(qi) * p.L;
  }
  const int key_begin = split * p.keys_per_split;
  const int key_end = min(len, key_begin + p.keys_per_split);
  const T* gK = static_cast<const T*>(p.k) + kv_row0 * kv_stride + kvh * kHeadDim + dl * kVec;
  const T* gV = static_cast<const T*>(p.v) + kv_row0 * kv_stride + kvh * kHeadDim + dl * kVec;
  uint4* my_ring = ring + warp * (kSimtStages * 2 * kU * 32) + lane;
  const int n_tiles =
      key_begin + warp * kKeysPerIter < key_end
          ? (key_end - key_begin - warp * kKeysPerIter + kSimtWarps * kKeysPerIter - 1) / (kSimtWarps * kKeysPerIter)
          : 0;
  // Issues the copies of this warp's tile `t` (keys t0 .. t0 + kKeysPerIter) into its stage.
  auto issue = [&](int t) {
    if (t < n_tiles) {
      const int t0 = key_begin + (t * kSimtWarps + warp) * kKeysPerIter;
      uint4* st = my_ring + (t % kSimtStages) * (2 * kU * 32);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int key = t0 + u * kKeysPerLoad + slot;
        const bool valid = key < key_end;
        const int64_t off = valid ? key * kv_stride : 0;
        CpAsync16(st + u * 32, gK + off, valid);
        CpAsync16(st + (kU + u) * 32, gV + off, valid);
      }
    }
    CpAsyncCommit();  // empty groups keep the wait count uniform
  };
#pragma unroll
  for (int t = 0; t < kSimtStages - 1; ++t) issue(t);

  float qf[kG][kVec];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const T* src = static_cast<const T*>(p.q) + (static_cast<int64_t>(qi) * p.Hq + h0 + g) * kHeadDim + dl * kVec;
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) qf[g][i] = ToFloat(e[i]) * p.scale_log2;
  }
  float acc[kG][kVec];
  float m[kG], l[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[g][i] = 0.0f;
  }

  for (int t = 0; t < n_tiles; ++t) {
    issue(t + kSimtStages - 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kSimtStages - 1));
    const int t0 = key_begin + (t * kSimtWarps + warp) * kKeysPerIter;
    const uint4* st = my_ring + (t % kSimtStages) * (2 * kU * 32);
    uint4 kr[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) kr[u] = st[u * 32];
    float s[kU][kG];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const T* ke = reinterpret_cast<const T*>(&kr[u]);
      float kf[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) kf[i] = ToFloat(ke[i]);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; ++i) d = fmaf(qf[g][i], kf[i], d);
#pragma unroll
        for (int off = kLanesPerKey / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        s[u][g] = (t0 + u * kKeysPerLoad + slot < key_end) ? d : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float mx = -INFINITY;
#pragma unroll
      for (int u = 0; u < kU; ++u) mx = fmaxf(mx, s[u][g]);
#pragma unroll
      for (int off = kLanesPerKey; off < 32; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[g], mx);  // finite: the warp's first key of this tile is valid
      const float alpha = FastExp2(m[g] - m_new);
      m[g] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        s[u][g] = FastExp2(s[u][g] - m_new);
        sum += s[u][g];
      }
      l[g] = l[g] * alpha + sum;
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[g][i] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const uint4 vraw = st[(kU + u) * 32];
      const T* ve = reinterpret_cast<const T*>(&vraw);
      float vf[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) vf[i] = ToFloat(ve[i]);
#pragma unroll
      for (int g = 0; g < kG; ++g) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[g][i] = fmaf(s[u][g], vf[i], acc[g][i]);
      }
    }
  }
  CpAsyncWaitAll();
  // The combine kernel (if any) may start launching; it waits for this grid to finish.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  __syncthreads();  // every warp is done with its ring: reuse it for the merge
  float(*s_o)[kG][kHeadDim] = reinterpret_cast<float(*)[kG][kHeadDim]>(ring);
  float(*s_ml)[kG][2] = reinterpret_cast<float(*)[kG][2]>(reinterpret_cast<float*>(ring) + kSimtWarps * kG * kHeadDim);
  // Merge the key slots of the warp (same max across the warp), then the warps.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int off = kLanesPerKey; off < 32; off <<= 1) {
      l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[g][i] += __shfl_xor_sync(0xffffffffu, acc[g][i], off);
    }
    if (slot == 0) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) s_o[warp][g][dl * kVec + i] = acc[g][i];
      if (dl == 0) {
        s_ml[warp][g][0] = m[g];
        s_ml[warp][g][1] = l[g];
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kG * kHeadDim; idx += blockDim.x) {
    const int g = idx / kHeadDim, d = idx % kHeadDim;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSimtWarps; ++w) mx = fmaxf(mx, s_ml[w][g][0]);
    float sum = 0.0f, out = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kSimtWarps; ++w) {
        const float f = FastExp2(s_ml[w][g][0] - mx);
        sum += f * s_ml[w][g][1];
        out += f * s_o[w][g][d];
      }
    }
    const int64_t row = static_cast<int64_t>(qi) * p.Hq + h0 + g;
    if (p.splits == 1) {
      static_cast<T*>(p.o)[row * kHeadDim + d] = FromFloat<T>(sum > 0.0f ? out / sum : 0.0f);
    } else {
      p.part_o[(row * p.splits + split) * kHeadDim + d] = out;
      if (d == 0) {
        p.part_ml[(row * p.splits + split) * 2] = mx;
        p.part_ml[(row * p.splits + split) * 2 + 1] = sum;
      }
    }
  }
}

constexpr int kMaxSplits = 1024;
constexpr int kCombineThreads = 128;

// One CTA per (query, head): merges the splits' partial results. Launched
// with programmatic dependent launch, so its launch overlaps the tail of the
// split kernel; griddepcontrol.wait holds it until the partials are written.
template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    CombineSplitsKernel(const float* __restrict__ part_o,   // [rows,splits,D]
                        const float* __restrict__ part_ml,  // [rows,splits,2]
                        T* __restrict__ o,                  // [rows,D]
                        int splits, int D) {
  __shared__ float s_w[kMaxSplits];
  __shared__ float s_inv;
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int64_t row = blockIdx.x;
  const float* ml = part_ml + row * splits * 2;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mx = -INFINITY;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, ml[2 * s]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float w = mx == -INFINITY ? 0.0f : FastExp2(ml[2 * s] - mx);
      s_w[s] = w;
      sum += w * ml[2 * s + 1];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) s_inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  __syncthreads();
  const float* po = part_o + row * splits * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) acc = fmaf(s_w[s], po[s * D + d], acc);
    o[row * D + d] = FromFloat<T>(acc * s_inv);
  }
}

// Largest G in {4, 2, 1} dividing the GQA group. G = 8 would need 64 more
// registers per thread than __launch_bounds__(128, 4) allows (ptxas spilled
// ~650 bytes); a group of 8 runs as two CTAs whose K/V reads hit in L2.
int HeadsPerCta(int group) { return group % 4 == 0 ? 4 : (group % 2 == 0 ? 2 : 1); }

template <typename T, int kHeadDim>
CudaStatus LaunchSimtHD(const SimtParams& p, int queries, int G, cudaStream_t stream) {
  const dim3 grid(p.splits, p.Hq / G, queries), block(kSimtWarps * 32);
  auto kernel = G == 4 ? SimtAttnKernel<T, kHeadDim, 4>
                       : (G == 2 ? SimtAttnKernel<T, kHeadDim, 2> : SimtAttnKernel<T, kHeadDim, 1>);
  // Four 48 KB rings per SM: ask for the whole L1 as shared memory.
  if (CudaStatus s = FS_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
      !s.ok())
    return s;
  kernel<<<grid, block, kSimtRingBytes, stream>>>(p);
  if (CudaStatus s = FS_CUDA_CHECK_LAUNCH(); !s.ok()) return s;
  if (p.splits > 1) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(queries * p.Hq);
    cfg.blockDim = dim3(kCombineThreads);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (CudaStatus s = FS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, CombineSplitsKernel<T>, p.part_o, p.part_ml,
                                                        static_cast<T*>(p.o), p.splits, kHeadDim));
        !s.ok())
      return s;
  }
  return CudaStatus::Ok();
}

template <typename T>
CudaStatus LaunchSimtDtype(const SimtParams& p, int D, int queries, cudaStream_t stream) {
  const int G = HeadsPerCta(p.group);
  return D == 128 ? LaunchSimtHD<T, 128>(p, queries, G, stream) : LaunchSimtHD<T, 64>(p, queries, G, stream);
}

CudaStatus LaunchSimt(DType dtype, const SimtParams& p, int D, int queries, cudaStream_t stream) {
  if (queries > 65535) return CudaStatus::Error("attention: more than 65535 queries in one launch");
  switch (dtype) {
    case DType::kBF16:
      return LaunchSimtDtype<__nv_bfloat16>(p, D, queries, stream);
    case DType::kF16:
      return LaunchSimtDtype<__half>(p, D, queries, stream);
    case DType::kF32:
      return LaunchSimtDtype<float>(p, D, queries, stream);
    default:
      return CudaStatus::Error("attention: unsupported dtype");
  }
}

}  // namespace

bool AttentionHeadDimSupported(int D) { return D == 64 || D == 128; }

std::string FormatAttentionConfig(const AttentionConfig& c) {
  if (c.hopper_stages > 0) {
    const std::vector<int> v = {128, c.hopper_stages, c.hopper_sched, c.hopper_stage_o ? 1 : 0, c.hopper_q_bufs};
    // One Q buffer keeps the four-field name that tuning caches already hold.
    return FormatConfigInts(c.hopper_q_bufs == 1 ? "hsoe" : "hsoeq", v);
  }
  return FormatConfigInts("mw", {c.block_m, c.warps});
}

bool ParseAttentionConfig(const std::string& s, AttentionConfig* c) {
  std::vector<int> v;
  const bool one_q = ParseConfigInts(s, "hsoe", &v);  // one Q buffer: no ".q" field
  if (one_q || ParseConfigInts(s, "hsoeq", &v)) {
    if (one_q) v.push_back(1);
    if (v[0] != 128 || v[3] > 1 || (!one_q && v[4] == 1) ||
        !HopperAttentionBuilt(HopperKnobs{v[1], v[2], v[3] == 1, v[4]})) {
      return false;
    }
    AttentionConfig h;
    h.block_m = 128;
    h.hopper_stages = v[1];
    h.hopper_sched = v[2];
    h.hopper_stage_o = v[3] == 1;
    h.hopper_q_bufs = v[4];
    *c = h;
    return true;
  }
  if (!ParseConfigInts(s, "mw", &v)) return false;
  const bool known = (v[0] == 128 && (v[1] == 4 || v[1] == 8)) || (v[0] == 64 && v[1] == 4);
  if (!known) return false;
  *c = AttentionConfig{v[0], v[1]};
  return true;
}

namespace {
// The Hopper kernel's default knobs (bench/notes/attention_hopper.md).
AttentionConfig HopperDefault() {
  AttentionConfig h;
  h.block_m = 128;
  h.hopper_stages = 2;
  h.hopper_sched = 2;
  h.hopper_stage_o = true;
  return h;
}
bool UseHopper(DType dtype, int D) { return HopperAttentionSupports(dtype, D) && HopperAttentionAvailable(); }
}  // namespace

AttentionConfig DefaultAttentionConfig(const AttentionParams& a, int sm_count) {
  if (UseHopper(a.dtype, a.D)) {
    // Measured (bench/notes/attention_hopper.md): ping-pong (o2) wins at
    // S=2048 and when short sequences fill at most one wave (B=1 S=512),
    // plain overlap (o1) on long sequences (B=4 S=8192: 3555 vs 3744 us), and
    // the in-order schedule (o0) on short sequences over several waves (B=4
    // S=512: 33.6-34.0 vs 36.0-36.3 us for o2 in four runs), where a CTA's
    // few key tiles leave nothing to overlap (not for a chunk after cached
    // keys: its tiles may have many).
    AttentionConfig h = HopperDefault();
    const int64_t tiles = static_cast<int64_t>((a.max_seqlen + 127) / 128) * a.Hq * a.B;
    if (a.max_seqlen <= 512 && a.k_starts == nullptr && tiles > sm_count) h.hopper_sched = 0;
    if (a.max_seqlen >= 4096) h.hopper_sched = 1;
    // Many short tiles (B=4 S=2048, B=8 S=1024 and 2048: eight waves or
    // more): o1 with a second Q buffer, 5-6% faster than o1 or o2 without
    // on an H200 at D=128 (at D=64 the in-order schedule below beats it);
    // 1-4% slower at S >= 4096 or under four waves.
    if (a.D == 128 && a.max_seqlen > 512 && a.max_seqlen <= 2048 && a.k_starts == nullptr &&
        tiles >= 8 * int64_t{sm_count}) {
      h.hopper_sched = 1;
      h.hopper_q_bufs = 2;
    }
    // Head dim 64 (the 1B preset's): a key tile's GEMMs are half as long as
    // at 128 and its softmax as long, and below 4096 tokens the in-order
    // schedule beats o2 by 5-8% (H200, B:S 1:2048, 4:2048, 8:1024; equal at
    // S=512; bench/notes/attention_hopper.md v9); from 4096 o1 and o0 trade
    // places between leases, so o1 stays.
    if (a.D == 64 && a.max_seqlen < 4096) h.hopper_sched = 0;
    return h;
  }
  // Measured B=1 S=2048 Hq=32 (512 CTAs of 128 rows): 154 us with 64 rows,
  // 167 us with 128; B=4 S=2048 the other way, 513 vs 496 us.
  const int64_t ctas128 = static_cast<int64_t>((a.max_seqlen + 127) / 128) * a.Hq * a.B;
  return AttentionConfig{ctas128 < 4 * std::max(1, sm_count) ? 64 : 128, 4};
}

std::vector<AttentionConfig> AttentionCandidates(DType dtype) {
  if (dtype == DType::kF32) return {{128, 4}};  // the fp32 path has no block size
  std::vector<AttentionConfig> c;
  if (UseHopper(dtype, 128)) {            // every head dim the kernels take
    AttentionConfig h = HopperDefault();  // s2.o2.e1
    c.push_back(h);
    h.hopper_stage_o = false;  // s2.o2.e0
    c.push_back(h);
    h.hopper_sched = 1;  // s2.o1.e0
    c.push_back(h);
    h.hopper_stage_o = true;  // s2.o1.e1
    c.push_back(h);
    h.hopper_sched = 0;  // s2.o0.e1
    c.push_back(h);
    h.hopper_stages = 3;  // s3.o1.e1
    h.hopper_sched = 1;
    c.push_back(h);
    h.hopper_stages = 2;
    h.hopper_q_bufs = 2;  // s2.o1.e1.q2
    c.push_back(h);
    h.hopper_sched = 2;  // s2.o2.e1.q2
    c.push_back(h);
  }
  c.push_back({128, 4});
  c.push_back({64, 4});
  c.push_back({128, 8});
  return c;
}

CudaStatus LaunchAttentionPrefill(const AttentionParams& a, const AttentionConfig& c, cudaStream_t stream) {
  int block_m = c.block_m, warps = c.warps;
  if (!AttentionHeadDimSupported(a.D)) {
    return CudaStatus::Unsupported("attention: head dim " + std::to_string(a.D) + " not supported (64 or 128)");
  }
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) return CudaStatus::Error("attention: Hq must be a multiple of Hkv");
  if (a.T == 0 || a.B == 0 || a.max_seqlen == 0) return CudaStatus::Ok();
  if (!Aligned16(a.q) || !Aligned16(a.k) || !Aligned16(a.v) || !Aligned16(a.o)) {
    return CudaStatus::Error("attention: q, k, v, o must be 16-byte aligned");
  }
  if (a.B > 65535 || a.Hq > 65535) return CudaStatus::Error("attention: B and Hq must be <= 65535");
  if (a.k_starts != nullptr && (c.hopper_stages == 0 || !UseHopper(a.dtype, a.D))) {
    return CudaStatus::Unsupported("attention: k_starts need the Hopper kernel (an h128 config on compute 9.0)");
  }
  if (c.hopper_stages > 0) {
    if (UseHopper(a.dtype, a.D))
      return LaunchAttentionHopper(a, HopperKnobs{c.hopper_stages, c.hopper_sched, c.hopper_stage_o, c.hopper_q_bufs},
                                   stream);
    block_m = 128;  // not a Hopper GPU (or fp32): the mma.sync shape
    warps = 4;
  }
  switch (a.dtype) {
    case DType::kBF16:
      return LaunchFlashDtype<__nv_bfloat16>(a, block_m, warps, stream);
    case DType::kF16:
      return LaunchFlashDtype<__half>(a, block_m, warps, stream);
    case DType::kF32: {
      SimtParams p{a.q,  a.k,   a.v,          a.o, nullptr,      nullptr,          a.seq_lens, 0,
                   a.Hq, a.Hkv, a.Hq / a.Hkv, 1,   a.max_seqlen, a.scale * kLog2e, true,       a.causal};
      return LaunchSimt(a.dtype, p, a.D, a.T, stream);
    }
    default:
      return CudaStatus::Error("attention: unsupported dtype");
  }
}

int DecodeDefaultSplits(DType dtype, int B, int L, int Hq, int Hkv, int D, int sm_count) {
  if (B <= 0 || L <= 0 || Hkv <= 0 || Hq % Hkv != 0) return 1;
  // Measured on the H100 (bench/gpu_compute_bench.cc, Hq=32 Hkv=8 D=128): one
  // CTA per SM already streams K/V at 95-100% of copy bandwidth through its
  // cp.async rings, so a batch that gives every SM a CTA gains nothing from
  // splitting (B=16 L=4096: 96 us unsplit, 101 us in 4 splits); a small batch
  // wants about two CTAs per SM (B=1 L=16384: 31 us in 32 splits, 37 us in 66).
  const int sms = std::max(1, sm_count);
  const int base = B * (Hq / HeadsPerCta(Hq / Hkv));
  if (base * 10 >= sms * 9) return 1;
  int splits = std::max(1, 2 * sms / base);
  splits = std::min(splits, std::max(1, L / kMinKeysPerSplit));
  // A power of two (B=1 L=16384: 31 us in 32 splits, 34 us in 33).
  int pow2 = 1;
  while (pow2 * 2 <= splits) pow2 *= 2;
  return std::min(pow2, kMaxSplits);
}

std::string FormatDecodeConfig(const DecodeConfig& c) { return FormatConfigInts("s", {c.splits}); }

bool ParseDecodeConfig(const std::string& s, DecodeConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "s", &v)) return false;
  *c = DecodeConfig{v[0]};
  return true;
}

std::vector<DecodeConfig> DecodeCandidates(int64_t L) {
  std::vector<DecodeConfig> c = {{0}};
  for (int s = 1; s <= 128 && (s == 1 || L / s >= 128); s *= 2) c.push_back({s});
  return c;
}

int DecodeSplits(const DecodeParams& a, const DecodeConfig& c, int sm_count) {
  int splits = c.splits;
  if (splits <= 0) splits = DecodeDefaultSplits(a.dtype, a.B, a.L, a.Hq, a.Hkv, a.D, sm_count);
  return std::max(1, std::min(splits, std::max(1, a.L)));
}

size_t DecodeWorkspaceBytes(int B, int Hq, int D, int splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(B) * Hq * splits * (D + 2) * sizeof(float);
}

CudaStatus LaunchAttentionDecode(const DecodeParams& a, int splits, void* workspace, cudaStream_t stream) {
  if (!AttentionHeadDimSupported(a.D)) {
    return CudaStatus::Unsupported("attention_decode: head dim " + std::to_string(a.D) + " not supported (64 or 128)");
  }
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) return CudaStatus::Error("attention_decode: Hq must be a multiple of Hkv");
  if (a.B == 0 || a.Hq == 0) return CudaStatus::Ok();
  if (!Aligned16(a.q) || !Aligned16(a.k_cache) || !Aligned16(a.v_cache)) {
    return CudaStatus::Error("attention_decode: q, k_cache, v_cache must be 16-byte aligned");
  }
  splits = std::max(1, std::min(splits, kMaxSplits));
  if (a.L > 0) splits = std::min(splits, a.L);
  if (splits > 1 && workspace == nullptr) return CudaStatus::Error("attention_decode: no workspace for splits");
  // Splits start on 64-key boundaries (whole tiles of every warp).
  const int keys_per_split = a.L <= 0 ? 64 : ((a.L + splits - 1) / splits + 63) / 64 * 64;
  splits = a.L <= 0 ? 1 : (a.L + keys_per_split - 1) / keys_per_split;
  float* part_o = static_cast<float*>(workspace);
  float* part_ml = part_o == nullptr ? nullptr : part_o + static_cast<size_t>(a.B) * a.Hq * splits * a.D;
  SimtParams p{a.q,  a.k_cache, a.v_cache,    a.o,    part_o,         part_ml,          a.lengths, a.L,
               a.Hq, a.Hkv,     a.Hq / a.Hkv, splits, keys_per_split, a.scale * kLog2e, false,     false};
  return LaunchSimt(a.dtype, p, a.D, a.B, stream);
}

}  // namespace fusedserve::cuda
