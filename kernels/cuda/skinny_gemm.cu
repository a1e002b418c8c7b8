// Few-row GEMMs on tensor cores (see skinny_gemm.h).
//
// Fragment trick: mma.m16n8k16 wants, per lane (g = lane / 4, t = lane % 4),
// A elements (row g and g + 8; k = 2t, 2t+1, 2t+8, 2t+9) and B elements
// (column g; the same k). A dot product does not care about the order of k,
// so within each 32-wide chunk lane t takes the 8 consecutive elements
// [8t, 8t + 8) of its rows with ONE 16-byte load per row, and the two mma
// k-steps of the chunk read them as (0-1, 2-3) and (4-5, 6-7); B (a row of x,
// one token) is loaded and split the same way. The weights go from HBM to
// registers to the tensor cores with full 16-byte loads and no shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_hopper.h"

namespace fusedserve::cuda {
namespace {

using cuda::FromFloat;
using cuda::Mma16816;

constexpr int kWarps = 8;

struct SkinnyParams {
  const void* x;  // [M,K]
  const void* w;  // [N,K], or [2N,K] gate then up (SwiGLU)
  void* y;        // [M,N]
  int64_t M, N, K;
  bool prefetch;  // first weight chunks before the PDL wait (FUSEDSERVE_SKINNY_PREFETCH=0: after)
  // The decode epilogues (GemvFusion's meaning; all null: none).
  const void* residual;   // [M,N]: y = x . w^T + residual
  const void* norm_next;  // [N] (with residual): norm_out = y * norm_next, sq_out += rows' sums of y^2
  void* norm_out;         // [M,N]
  unsigned long long* sq_out;
  unsigned long long* sq_clear;     // [M] zeroed by block 0
  const unsigned long long* sq_in;  // a producer's sums: the products scaled by rsqrt(sum / K + eps)
  float eps;
  bool rope_kv;     // the QKV epilogue (y unused): rope, q and the paged cache rows
  GemvRopeKv rope;  // its operands (q/k head rows interleaved, as for the GEMV)
};

bool SkinnyPrefetch() {
  static const bool on = EnvKnob("FUSEDSERVE_SKINNY_PREFETCH", 0, 1, 1) != 0;
  return on;
}

__device__ __forceinline__ uint4 LoadWeights(const uint4* p) { return __ldcs(p); }  // read once: stream past L1/L2

// The QKV epilogue of one accumulator: value v of output feature f (row f
// of wqkv, whose q/k head rows are interleaved: rows 2i, 2i + 1 = a head's
// elements i, i + D/2) for token tok. The rotation partner, feature f ^ 1,
// sits in lane ^ 4 (g ^ 1); every lane of the warp must call this.
template <typename T>
__device__ __forceinline__ void RopeEpilogue(const GemvRopeKv& rp, float v, bool valid, int g, int64_t f, int pos,
                                             int slot, int64_t tok) {
  const float partner = __shfl_xor_sync(0xffffffffu, v, 4);
  if (!valid) return;
  const int D = rp.D, half = D / 2;
  const int h = static_cast<int>(f / D), e = static_cast<int>(f - static_cast<int64_t>(h) * D);
  if (h < rp.Hq + rp.Hkv) {
    const int i = e / 2;
    const float2 cs = rp.cos_sin[static_cast<int64_t>(pos) * half + i];
    const bool first = (g & 1) == 0;  // element i (else i + D/2)
    const T out = FromFloat<T>(first ? v * cs.x - partner * cs.y : v * cs.x + partner * cs.y);
    const int at = first ? i : i + half;
    if (h < rp.Hq) {
      static_cast<T*>(rp.q)[(tok * rp.Hq + h) * D + at] = out;
    } else {
      if (rp.k != nullptr) static_cast<T*>(rp.k)[(tok * rp.Hkv + h - rp.Hq) * D + at] = out;
      if (slot >= 0) static_cast<T*>(rp.k_cache)[(static_cast<int64_t>(slot) * rp.Hkv + h - rp.Hq) * D + at] = out;
    }
  } else {  // v heads in the plain order
    const int vh = h - rp.Hq - rp.Hkv;
    const T out = FromFloat<T>(v);
    if (rp.v != nullptr) static_cast<T*>(rp.v)[(tok * rp.Hkv + vh) * D + e] = out;
    if (slot >= 0) static_cast<T*>(rp.v_cache)[(static_cast<int64_t>(slot) * rp.Hkv + vh) * D + e] = out;
  }
}

// kNT tiles of 8 tokens (M <= 8 kNT); each warp keeps kC chunks of 32 in
// flight (fewer with more token tiles or the second SwiGLU matrix, so the
// kernel stays within 128 registers: two blocks per SM).
template <typename T, int kNT, bool kSwiglu>
__global__ void __launch_bounds__(kWarps * 32, 2) SkinnyGemmKernel(SkinnyParams p, int split) {
  constexpr int kC = (kSwiglu ? 4 : 8) / kNT;
  constexpr int kAcc = kSwiglu ? 2 : 1;  // gate and up
  constexpr int kTok = kNT * 8;
  __shared__ float partial[kWarps][kAcc][kNT][4][32];
  // Epilogue operands, staged while the weights stream: the rows' rstd
  // (sq_in), positions and cache slots (rope), and the block's residual and
  // next-norm columns (cp.async).
  __shared__ float rstd_s[kTok];
  __shared__ int pos_s[kTok], slot_s[kTok];  // rope: each token's position and cache slot (-1: none)
  __shared__ alignas(16) T res_s[kTok][kWarps * 16];
  __shared__ alignas(16) T gnext_s[kWarps * 16];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int slice = warp % split;
  const int64_t tiles = p.N / 16;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * (kWarps / split) + warp / split;
  const bool live = tile < tiles;
  const int64_t chunks = p.K / 32;
  const int64_t kv = p.K / 8;  // 16-byte vectors per row

  // This lane's weight rows (tile rows g and g + 8; SwiGLU: and their up rows)
  // and token rows (g of each 8-token tile), as 16-byte vector pointers at
  // element 8t of the chunk.
  const uint4* wv = static_cast<const uint4*>(p.w);
  const uint4* w_lo[kAcc];
  const uint4* w_hi[kAcc];
#pragma unroll
  for (int a = 0; a < kAcc; ++a) {
    const int64_t r = (live ? tile : 0) * 16 + g + a * p.N;
    w_lo[a] = wv + r * kv + t;
    w_hi[a] = wv + (r + 8) * kv + t;
  }
  const uint4* xv = static_cast<const uint4*>(p.x);

  float acc[kAcc][kNT][4];
#pragma unroll
  for (int a = 0; a < kAcc; ++a)
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[a][n][j] = 0.0f;

  uint4 lo[kAcc][kC], hi[kAcc][kC];
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const int64_t c = c0 + i;
      if (c >= chunks) break;
#pragma unroll
      for (int a = 0; a < kAcc; ++a) {
        lo[a][i] = LoadWeights(w_lo[a] + c * 4);
        hi[a][i] = LoadWeights(w_hi[a] + c * 4);
      }
    }
  };
  // Weights do not depend on the previous kernel: the first chunks go out
  // before the PDL wait (their HBM round trip overlaps the previous
  // kernel's tail); only x waits.
  const int64_t c_first = static_cast<int64_t>(slice) * kC;
  if (live && p.prefetch) load_weights(c_first);
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * (kWarps / split) * 16;  // the block's first column
  const int cols = static_cast<int>(min(static_cast<int64_t>(kWarps / split) * 16, p.N - f0));
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const bool epilogue = p.sq_in != nullptr || p.residual != nullptr || p.rope_kv;
  if (epilogue) {
    if (p.sq_in != nullptr && threadIdx.x < p.M)
      rstd_s[threadIdx.x] =
          rsqrtf(static_cast<float>(__ldcg(p.sq_in + threadIdx.x)) / kNormSumScale / static_cast<float>(p.K) + p.eps);
    if (p.rope_kv && threadIdx.x < p.M) {
      pos_s[threadIdx.x] = p.rope.positions[threadIdx.x];
      slot_s[threadIdx.x] = p.rope.slots != nullptr ? p.rope.slots[threadIdx.x] : -1;
    }
    // 16-byte pieces (8 columns) of the block's residual rows and norm weight.
    const int pieces = cols / 8;
    if (p.residual != nullptr) {
      const T* res = static_cast<const T*>(p.residual);
      for (int i = threadIdx.x; i < p.M * pieces; i += kWarps * 32) {
        const int m = i / pieces, c = (i % pieces) * 8;
        CpAsync16(&res_s[m][c], res + m * p.N + f0 + c, true);
      }
    }
    if (p.norm_next != nullptr)
      for (int i = threadIdx.x; i < pieces; i += kWarps * 32)
        CpAsync16(&gnext_s[i * 8], static_cast<const T*>(p.norm_next) + f0 + i * 8, true);
    CpAsyncCommit();
  }
  if (live) {
    for (int64_t c0 = c_first; c0 < chunks; c0 += static_cast<int64_t>(split) * kC) {
      uint4 xb[kC][kNT];
      if (c0 != c_first || !p.prefetch) load_weights(c0);
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        const int64_t c = c0 + i;
        if (c >= chunks) break;
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          const int64_t tok = n * 8 + g;
          xb[i][n] = tok < p.M ? __ldg(xv + tok * kv + c * 4 + t) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        if (c0 + i >= chunks) break;
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {  // the chunk's two k-steps: elements (0-3) and (4-7) of each lane
#pragma unroll
          for (int a = 0; a < kAcc; ++a) {
            const uint32_t* l = reinterpret_cast<const uint32_t*>(&lo[a][i]);
            const uint32_t* h = reinterpret_cast<const uint32_t*>(&hi[a][i]);
            const uint32_t frag[4] = {l[2 * ks], h[2 * ks], l[2 * ks + 1], h[2 * ks + 1]};
#pragma unroll
            for (int n = 0; n < kNT; ++n) {
              const uint32_t* b = reinterpret_cast<const uint32_t*>(&xb[i][n]);
              Mma16816<T>(acc[a][n], frag, b[2 * ks], b[2 * ks + 1]);
            }
          }
        }
      }
    }
  }
  if (epilogue) CpAsyncWaitAll();
  if (split > 1 || epilogue) {
    // Slices 1.. hand their tiles to slice 0 of the group through shared memory.
    if (slice != 0) {
#pragma unroll
      for (int a = 0; a < kAcc; ++a)
#pragma unroll
        for (int n = 0; n < kNT; ++n)
#pragma unroll
          for (int j = 0; j < 4; ++j) partial[warp][a][n][j][lane] = acc[a][n][j];
    }
    __syncthreads();
    if (slice != 0) return;
    for (int s = 1; s < split; ++s) {
#pragma unroll
      for (int a = 0; a < kAcc; ++a)
#pragma unroll
        for (int n = 0; n < kNT; ++n)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[a][n][j] += partial[warp + s][a][n][j][lane];
    }
  }
  if (blockIdx.x == 0 && p.sq_clear != nullptr && threadIdx.x < p.M) p.sq_clear[threadIdx.x] = 0;
  if (!live) return;
  // Accumulator j of tile n: feature tile*16 + g (+8 for j >= 2), token n*8 + 2t (+1 for odd j).
  T* y = static_cast<T*>(p.y);
  float sumsq[kNT][2] = {};  // norm epilogue: this lane's tokens n*8 + 2t + e, over its two columns
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t tok = n * 8 + 2 * t + (j & 1);
      const int64_t f = tile * 16 + g + (j >= 2 ? 8 : 0);
      if constexpr (!kSwiglu) {
        if (p.rope_kv) {  // every lane takes part in the shuffle
          const bool valid = tok < p.M;
          RopeEpilogue<T>(p.rope, acc[0][n][j] * (p.sq_in != nullptr && valid ? rstd_s[tok] : 1.0f), valid, g, f,
                          valid ? pos_s[tok] : 0, valid ? slot_s[tok] : -1, tok);
          continue;
        }
      }
      if (tok >= p.M) continue;
      const float r = p.sq_in != nullptr ? rstd_s[tok] : 1.0f;
      float v = acc[0][n][j] * r;
      if constexpr (kSwiglu) {
        v = v / (1.0f + __expf(-v)) * (acc[1][n][j] * r);
      } else if (p.residual != nullptr) {
        v += ToFloat(res_s[tok][f - f0]);
      }
      const T out = FromFloat<T>(v);
      y[tok * p.N + f] = out;
      if (p.norm_out != nullptr) {  // the norm of the values as stored
        const float stored = ToFloat(out);
        static_cast<T*>(p.norm_out)[tok * p.N + f] = FromFloat<T>(stored * ToFloat(gnext_s[f - f0]));
        sumsq[n][j & 1] += stored * stored;
      }
    }
  }
  if (p.sq_out != nullptr) {
    // Over the warp's 16 columns (lanes of equal t), then one fixed-point add
    // per token and warp: integer adds, so the order does not matter.
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = sumsq[n][e];
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        v += __shfl_xor_sync(0xffffffffu, v, 8);
        v += __shfl_xor_sync(0xffffffffu, v, 16);
        const int tok = n * 8 + 2 * t + e;
        if (g == 0 && tok < p.M)
          atomicAdd(p.sq_out + tok, static_cast<unsigned long long>(__float2ull_rn(v * kNormSumScale)));
      }
  }
}

// FUSEDSERVE_SKINNY_ONE_TILE=0: steps of up to 8 rows on the two-tile kernel
// (the A/B of the one-tile one).
bool SkinnyOneTile() {
  static const bool on = EnvKnob("FUSEDSERVE_SKINNY_ONE_TILE", 0, 1, 1) != 0;
  return on;
}

template <typename T, bool kSwiglu>
CudaStatus LaunchTyped(const SkinnyParams& p, cudaStream_t stream) {
  // Token tiles: one up to 8 rows, so its warps keep twice the weight chunks
  // in flight (the projections of a decode step with K = 2048 then load all
  // their weights in one round, issued before the PDL wait). Measured on the
  // H100 (llama-3.2-1b decode, bench/notes/decode_fusion.md): B=2 and 4 steps
  // 5% faster than on the two-tile kernel.
  const int nt = p.M <= 8 && SkinnyOneTile() ? 1 : p.M <= 16 ? 2 : 4;
  auto kernel = nt == 1   ? SkinnyGemmKernel<T, 1, kSwiglu>
                : nt == 2 ? SkinnyGemmKernel<T, 2, kSwiglu>
                          : SkinnyGemmKernel<T, 4, kSwiglu>;
  int64_t resident_blocks = 0;
  if (CudaStatus s = cuda::ResidentBlocks(kernel, kWarps * 32, &resident_blocks); !s.ok()) return s;
  // Split K over up to kWarps warps while the tiles alone leave the GPU's
  // warp slots mostly empty (a 2048-wide output is only 128 tiles).
  const int64_t tiles = p.N / 16;
  const int64_t resident = resident_blocks * kWarps;
  int split = 1;
  const int64_t chunks_in_flight = (kSwiglu ? 4 : 8) / nt;  // kC of the kernel
  while (split < kWarps && tiles * split * 2 <= resident && p.K / 32 >= split * 2 * chunks_in_flight) split *= 2;
  const int64_t per_block = kWarps / split;
  const int64_t blocks = (tiles + per_block - 1) / per_block;
  if (blocks > 0x7fffffff) return CudaStatus::Error("skinny GEMM: N too large");
  return cuda::LaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, stream, 1, p, split);
}

// The plain product's parameters (no epilogue).
SkinnyParams PlainParams(const void* x, const void* w, void* y, int64_t M, int64_t N, int64_t K) {
  SkinnyParams p{};
  p.x = x;
  p.w = w;
  p.y = y;
  p.M = M;
  p.N = N;
  p.K = K;
  p.prefetch = SkinnyPrefetch();
  return p;
}

template <bool kSwiglu>
CudaStatus LaunchDtype(DType dtype, const SkinnyParams& p, cudaStream_t stream) {
  switch (dtype) {
    case DType::kBF16:
      return LaunchTyped<__nv_bfloat16, kSwiglu>(p, stream);
    case DType::kF16:
      return LaunchTyped<__half, kSwiglu>(p, stream);
    default:
      return CudaStatus::Unsupported("skinny GEMM: bf16/fp16 only");
  }
}

// Which fused projections of a step above one token tile run the Hopper
// skinny kernel instead of the register kernels (FUSEDSERVE_SKINNY_HOPPER_DOWN:
// 0 none, 1 only the long-K producer, down: K = I >= 2N, 3 all; else, the
// default, all but a many-wave output at up to 16 rows). Measured on an H200
// (1B decode step, ctx 128): the layers' projections on it, B=20-32 1.06-1.08
// ms against 1.30-1.32 with down alone on it (at 17-32 rows the register
// kernel's four token tiles leave each warp two weight chunks in flight);
// the LM head (1,002 CTAs, 7.6 waves on it) on the two-tile register kernel
// at 9-16 rows, 134 us against 151 (B=12 / 16 1.043-1.052 ms vs
// 1.065-1.073), on it at 17-32 rows (B=24 / 32 1.062-1.071 vs 1.071-1.086).
int SkinnyHopperMode() {
  static const int mode = EnvKnob("FUSEDSERVE_SKINNY_HOPPER_DOWN", 0, 3, 2);
  return SkinnyHopperAvailable() ? mode : 0;
}
// N output features (SwiGLU: I) from x [M,K] and w; y the output, which the
// Hopper kernel also needs 16-byte aligned.
bool SkinnyHopperFused(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, const void* y,
                       const GemvFusion& f, bool swiglu) {
  if (M <= 8 || !SkinnyHopperSupported(dtype, M, N, K, x, w) || !Aligned16(y)) return false;
  switch (SkinnyHopperMode()) {
    case 1:
      return !swiglu && K >= 2 * N && f.residual != nullptr && !f.rope_kv && f.sq_in == nullptr;
    case 2:
      return M > 16 || SkinnyHopperOneWave(N, swiglu);
    case 3:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool SkinnyGemmShape(DType dtype, int64_t M, int64_t N, int64_t K) {
  const int64_t max_m = SkinnyHopperAvailable() ? kSkinnyMaxM : kSkinnyNarrowMaxM;
  return (dtype == DType::kBF16 || dtype == DType::kF16) && M > 0 && M <= max_m && N > 0 && N % 16 == 0 && K > 0 &&
         K % 32 == 0;
}

bool SkinnyGemmByDefault(int64_t M, int64_t N, int64_t K, bool swiglu) {
  // FUSEDSERVE_SKINNY_WIDE: 0 never, 1 always, else the rule below.
  static const int wide = EnvKnob("FUSEDSERVE_SKINNY_WIDE", 0, 1, 2);
  if (M <= kSkinnyNarrowMaxM) return true;
  if (M > kSkinnyMaxM || wide == 0) return false;
  return wide == 1 || (swiglu ? SkinnyHopperOneWave(N, true) : K >= 4096 && N <= 2048);
}

bool SkinnyGemmSupported(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w) {
  return SkinnyGemmShape(dtype, M, N, K) && cuda::Aligned16(x) && cuda::Aligned16(w);
}

CudaStatus LaunchSkinnyGemm(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                            cudaStream_t stream, bool hopper) {
  if (!SkinnyGemmSupported(dtype, M, N, K, x, w)) return CudaStatus::Unsupported("skinny GEMM: unsupported problem");
  if (M > kSkinnyNarrowMaxM || (hopper && SkinnyHopperAvailable())) {
    return LaunchSkinnyHopper(dtype, M, N, K, x, w, y, stream);
  }
  return LaunchDtype<false>(dtype, PlainParams(x, w, y, M, N, K), stream);
}

CudaStatus LaunchSkinnySwiglu(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                              cudaStream_t stream) {
  if (!SkinnyGemmSupported(dtype, M, I, D, x, gate_up)) {
    return CudaStatus::Unsupported("skinny SwiGLU: unsupported problem");
  }
  if (M > kSkinnyNarrowMaxM) return LaunchSkinnyHopperSwiglu(dtype, M, D, I, x, gate_up, h, stream);
  return LaunchSkinnySwigluFused(dtype, M, D, I, x, gate_up, h, GemvFusion{}, stream);
}

CudaStatus LaunchSkinnyGemmFused(DType dtype, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y,
                                 const GemvFusion& f, cudaStream_t stream) {
  if (!SkinnyGemmSupported(dtype, M, N, K, x, w))
    return CudaStatus::Unsupported("fused skinny GEMM: unsupported problem");
  if (f.norm_weight != nullptr) return CudaStatus::Unsupported("fused skinny GEMM: no folded norm");
  if (!f.NormNextConsistent())
    return CudaStatus::Error("fused skinny GEMM: norm_next, norm_out, sq_out and sq_clear go together");
  if (!f.EpiloguesCombine())
    return CudaStatus::Unsupported(
        "fused skinny GEMM: the next norm's epilogue needs the residual add, rope excludes it");
  if (!Aligned16(f.residual) || !Aligned16(f.norm_next))
    return CudaStatus::Unsupported("fused skinny GEMM: residual or norm weight not 16-byte aligned");
  if (f.rope_kv) {
    const GemvRopeKv& r = f.rope;
    if (!r.ShapeFits(N, 16)) return CudaStatus::Unsupported("fused skinny GEMM: rope epilogue shape");
    if (!r.TensorsPresent()) return CudaStatus::Error("fused skinny GEMM: rope epilogue tensor missing");
  } else if (y == nullptr) {
    return CudaStatus::Error("fused skinny GEMM: no output");
  }
  // Above the narrow kernel's rows SkinnyGemmSupported implies the Hopper kernel.
  if (M > kSkinnyNarrowMaxM || SkinnyHopperFused(dtype, M, N, K, x, w, y, f, false))
    return LaunchSkinnyHopperFused(dtype, M, N, K, x, w, y, f, stream);
  SkinnyParams p = PlainParams(x, w, y, M, N, K);
  p.residual = f.residual;
  p.norm_next = f.norm_next;
  p.norm_out = f.norm_out;
  p.sq_out = f.sq_out;
  p.sq_clear = f.sq_clear;
  p.sq_in = f.sq_in;
  p.eps = f.eps;
  p.rope_kv = f.rope_kv;
  p.rope = f.rope;
  return LaunchDtype<false>(dtype, p, stream);
}

CudaStatus LaunchSkinnySwigluFused(DType dtype, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                                   void* h, const GemvFusion& f, cudaStream_t stream) {
  if (!SkinnyGemmSupported(dtype, M, I, D, x, gate_up))
    return CudaStatus::Unsupported("fused skinny SwiGLU: unsupported problem");
  if (!f.OnlyConsumerSums()) return CudaStatus::Unsupported("fused skinny SwiGLU: only a producer's sums");
  if (M > kSkinnyNarrowMaxM || SkinnyHopperFused(dtype, M, I, D, x, gate_up, h, f, true))
    return LaunchSkinnyHopperSwiglu(dtype, M, D, I, x, gate_up, h, stream, f);
  SkinnyParams p = PlainParams(x, gate_up, h, M, I, D);
  p.sq_in = f.sq_in;
  p.eps = f.eps;
  return LaunchDtype<true>(dtype, p, stream);
}

}  // namespace fusedserve::cuda
