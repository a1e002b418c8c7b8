// Hopper flash-attention prefill (see kernels/cuda/attention_hopper.h),
// FlashAttention-3 style, built for sm_90a only (CMake's sm90a object
// library). Persistent CTAs (one per SM) walk 128-row query tiles of one
// (sequence, q head) each, heaviest first; a CTA:
//   warpgroup 0 (producer, 24 registers): one thread issues TMA loads of the
//     Q tile and of 128-key K and V tiles into 128B-swizzled shared memory,
//     kStages deep, each K and V stage (and Q) guarded by full
//     (transaction-count) and empty mbarriers, so the next tile's Q and K/V
//     load while the consumers finish the last one;
//   warpgroups 1 and 2 (consumers, 240 registers): 64 query rows each;
//     S = Q K^T by wgmma with both operands in shared memory, the causal /
//     length mask on the tiles that need it, online softmax in registers
//     (exp2, scale folded in), then O += P V by wgmma with P (the S
//     accumulators rounded to 16 bits) as the register A operand and V read
//     MN-major (transposed) from shared memory.
// kSched 0: each key tile in sequence (S, softmax, P V). 1: the consumer
// issues S(j+1) and P(j)V(j) back to back and does the softmax of tile j+1
// while P(j)V(j) still runs (FA3's intra-warpgroup pipelining). 2: that plus
// ping-pong between the two consumer warpgroups: named barriers make them
// take turns issuing their GEMMs, so one's softmax runs under the other's
// GEMMs and the tensor cores see one stream of work. Key tiles run from the
// last to the first, so the one causal diagonal tile (masked) comes first
// and fully masked tiles are never loaded.
// Packed varlen: the tensor maps cover the whole [T, H, D] tensors; a tile
// starts at its sequence's offset, rows past the sequence belong to the next
// one (masked out of the scores, never stored) or lie past T (TMA fills
// zeros). O is written with ordinary masked stores (staged through shared
// memory for 16-byte row stores with kStageO where it fits), never TMA.
// With k_starts (a later chunk of each sequence) K/V have their own packing
// (k_start + seqlen rows per sequence); a query tile's key tiles start at
// the sequence's first key and the causal diagonal is bottom-right aligned,
// so a tile's work grows with its k_start (the tile order stays by m block:
// heaviest first within a sequence, approximately across a mixed batch).
#include <cuda.h>  // CUtensorMap and the encoder's types; the function itself comes through the runtime
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/attention_hopper.h"
#include "kernels/cuda/buffers.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/sm90a/hopper.cuh"

namespace fusedserve::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBlockM = 128;  // query rows per CTA: two consumer warpgroups of 64
constexpr int kBlockN = 128;  // keys per K/V tile
constexpr int kThreads = 384;
constexpr int kAtomCols = 64;    // 16-bit columns in one 128-byte swizzle row
constexpr int kAtomBytes = 128;  // bytes per row of a swizzle atom

template <int kD, int kStages, bool kStageORequested, int kQBufsRequested>
struct HopperLayout {
  static constexpr int kQBytes = kBlockM * kD * 2;
  static constexpr int kKVBytes = kBlockN * kD * 2;  // one K (or V) stage
  static constexpr int kQ = 0;
  static constexpr int kK = kQBytes;
  static constexpr int kV = kK + kStages * kKVBytes;
  static constexpr int kO = kV + kStages * kKVBytes;
  // O goes out through shared memory (coalesced 16-byte row stores) when
  // asked for and it fits; else straight from the accumulators (4-byte
  // stores).
  static constexpr int kOBytes = kBlockM * kD * 2;
  static constexpr int kBarNoStage = kO;
  static constexpr int kBarStage = kO + kOBytes;
  // q_full[2], q_empty[2], k_full[kStages], v_full[kStages],
  // k_empty[kStages], v_empty[kStages], tile_full[kRing],
  // tile_empty[kRing]; then the tile ring's kRing indices; 1 KB of slack to
  // align the base to the 1024-byte swizzle period.
  static constexpr int kRing = 2;
  static constexpr int kTileBar = 4 + 4 * kStages;  // index of tile_full[0]
  static constexpr int kRingOff = (kTileBar + 2 * kRing) * 8;
  static constexpr int kBarBytes = kRingOff + kRing * 4 + 1024;
  static constexpr bool kStageO = kStageORequested && kBarStage + kBarBytes <= 227 * 1024;
  // A second Q buffer (when asked for and it fits after the staged O): the
  // next tile's Q then loads while this tile's last key tiles run, not
  // after its last S.
  static constexpr int kQ2 = kStageO ? kBarStage : kBarNoStage;
  static constexpr int kQBufs = kQBufsRequested == 2 && kQ2 + kQBytes + kBarBytes <= 227 * 1024 ? 2 : 1;
  static constexpr int kBar = kQ2 + (kQBufs - 1) * kQBytes;
  static constexpr int kBytes = kBar + kBarBytes;
  static_assert(kBytes <= 227 * 1024, "shared memory");
};

struct HopperParams {
  void* o;                  // [T,Hq,D]
  const int32_t* seq_lens;  // [B]
  const int32_t* k_starts;  // [B] or null: keys before each sequence's queries
  int B, Hq, group;         // group = Hq / Hkv
  int m_blocks;             // 128-row query blocks of the longest sequence
  float scale_log2;         // scale * log2(e)
  bool causal;
  // {next tile, CTAs done}: the dynamic tile scheduler's counters, zero at
  // launch (the launch's last CTA resets them); null: the static snake order.
  int* sched;
};

// ---- mbarrier and TMA -------------------------------------------------------

// One box of a 3D map ({column, head, row} coordinates) into shared memory,
// completing on `bar` with its byte count.
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// ---- wgmma ------------------------------------------------------------------

// Shared-memory matrix descriptor, 128B swizzle: start address, leading and
// stride byte offsets in 16-byte units. K-major tiles (Q, K) use SBO = 1024
// (8 rows of 128 bytes); V read MN-major also uses LBO = the distance between
// its 64-column atoms.
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}
// Keeps the compiler from moving register reads/writes across an async
// wgmma's issue or wait (its operands are live until the wait).
template <int N>
__device__ __forceinline__ void FenceRegs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void FenceRegs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

// D[64 x N] (+)= A[64 x 16] B[16 x N]: A and B K-major in shared memory.
template <typename T, int N>
__device__ __forceinline__ void WgmmaSS(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d);
// D[64 x N] += A[64 x 16] (registers) B[16 x N] (shared memory, MN-major).
template <typename T, int N>
__device__ __forceinline__ void WgmmaRS(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int scale_d);

// clang-format off
template <>
__device__ __forceinline__ void WgmmaRS<__nv_bfloat16, 64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void WgmmaRS<__half, 64>(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void WgmmaSS<__nv_bfloat16, 128>(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void WgmmaRS<__nv_bfloat16, 128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void WgmmaSS<__half, 128>(float (&d)[64], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(scale_d));
}

template <>
__device__ __forceinline__ void WgmmaRS<__half, 128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}
// clang-format on

// ---- the kernel ---------------------------------------------------------------

template <typename T, int kD, int kStages, int kSched, bool kStageO, int kQBufs>
__global__ void __launch_bounds__(kThreads, 1)
    HopperFlashKernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v, const HopperParams p) {
  using L = HopperLayout<kD, kStages, kStageO, kQBufs>;
  constexpr int kAtoms = kD / kAtomCols;  // 64-column swizzle atoms per row
  constexpr int kSRegs = kBlockN / 2;     // S accumulators per thread
  constexpr int kORegs = kD / 2;          // O accumulators per thread
  constexpr int kPSteps = kBlockN / 16;   // k16 steps of P V

  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t sQ = base + L::kQ, sK = base + L::kK, sV = base + L::kV, bar = base + L::kBar;
  uint8_t* const sO = smem_raw + (base - static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw))) + L::kO;
  // Q tile qi (the CTA's qi-th) sits in buffer qi % kQBufs; its barriers'
  // phase is that buffer's use count.
  auto q_buf = [&](int qi) { return qi % L::kQBufs == 0 ? sQ : base + L::kQ2; };
  auto q_full = [&](int qi) { return bar + 8u * (qi % L::kQBufs); };
  auto q_empty = [&](int qi) { return bar + 8u * (2 + qi % L::kQBufs); };
  auto q_phase = [&](int qi) { return static_cast<uint32_t>((qi / L::kQBufs) & 1); };
  auto k_full = [&](int s) { return bar + 8u * (4 + s); };
  auto v_full = [&](int s) { return bar + 8u * (4 + kStages + s); };
  auto k_empty = [&](int s) { return bar + 8u * (4 + 2 * kStages + s); };
  auto v_empty = [&](int s) { return bar + 8u * (4 + 3 * kStages + s); };
  // The tile ring: the producer publishes the k-th tile of this CTA (or -1:
  // no more) in slot k % kRing for the consumers.
  auto tile_full = [&](int k) { return bar + 8u * (L::kTileBar + k % L::kRing); };
  auto tile_empty = [&](int k) { return bar + 8u * (L::kTileBar + L::kRing + k % L::kRing); };
  auto tile_slot = [&](int k) { return bar + L::kRingOff + 4u * (k % L::kRing); };

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int b = 0; b < L::kQBufs; ++b) {
      MbarInit(q_full(b), 1);
      MbarInit(q_empty(b), 8);  // lane 0 of each consumer warp
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(k_full(s), 1);
      MbarInit(v_full(s), 1);
      MbarInit(k_empty(s), 8);
      MbarInit(v_empty(s), 8);
    }
    for (int k = 0; k < L::kRing; ++k) {
      MbarInit(tile_full(k), 1);
      MbarInit(tile_empty(k), 8);  // lane 0 of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Persistent CTAs: tile t = (m block, head, sequence) with the heaviest
  // (last) m blocks first. With p.sched each CTA starts with tile c (its
  // index), then the next untaken one (an atomic counter) each time it has
  // issued a tile's last copy: greedy, heaviest first, so the CTAs finish
  // together (a model of B=4 S=2048's tile costs puts the slowest CTA 0.4-1.1%
  // above the mean, against 3.1% for the static order). Without it, in round r CTA c
  // takes tile r G + c (even r) or r G + G - 1 - c (odd r), G = gridDim.x:
  // the snake order (round-robin gave CTA 0 40 key tiles and CTA 131 24 at
  // B=1 S=2048). The producer picks the tiles and hands each to the
  // consumers through the tile ring, so their barrier phases stay in step.
  const int heads_x_seqs = p.Hq * p.B;
  const int n_tiles = p.m_blocks * heads_x_seqs;
  const int grid = gridDim.x;
  const int n_rounds = (n_tiles + grid - 1) / grid;
  const int cta = static_cast<int>(blockIdx.x);
  auto snake = [&](int r) { return r * grid + ((r & 1) ? grid - 1 - cta : cta); };
  // seqlen: query rows; k_start: keys before them (k_len = k_start +
  // seqlen keys); seq_start / k_seq_start: packed offsets in q/o and k/v.
  struct Tile {
    int m_block, h, b, seqlen, seq_start, n_blocks, k_start, k_len, k_seq_start;
  };
  // Warp-cooperative (SequenceStart); false for tiles past their sequence.
  // one_trip (the consumers, for the next tile under a tile's last P V): every
  // load is issued at once, one round trip instead of a chain of two or four
  // (the length, then the prefix sum's loads, then k_starts'); at D=64, whose
  // S takes half as long, the chain outlasted it (ncu at locked clocks, B=4
  // S=2048: 3.8% faster; D=128 unchanged). The producer, at 24 registers,
  // keeps the chain: the loads held at once made it spill. (One body with the
  // length check placed by one_trip measured 3% slower at D=64: the
  // consumers' loads no longer all went out first.)
  auto decode = [&](int t, Tile* tile, auto one_trip) {
    const int r = t % heads_x_seqs;
    tile->m_block = p.m_blocks - 1 - t / heads_x_seqs;
    tile->h = r % p.Hq;
    tile->b = r / p.Hq;
    if constexpr (decltype(one_trip)::value) {
      const int seqlen = p.seq_lens[tile->b];
      const int k_start = p.k_starts != nullptr ? p.k_starts[tile->b] : 0;
      const int seq_start = SequenceStart(p.seq_lens, tile->b);
      const int k_before = p.k_starts != nullptr ? SequenceStart(p.k_starts, tile->b) : 0;
      tile->seqlen = seqlen;
      if (tile->m_block * kBlockM >= seqlen) return false;
      tile->seq_start = seq_start;
      tile->k_start = k_start;
      tile->k_seq_start = seq_start + k_before;
    } else {
      tile->seqlen = p.seq_lens[tile->b];
      if (tile->m_block * kBlockM >= tile->seqlen) return false;
      tile->seq_start = SequenceStart(p.seq_lens, tile->b);
      tile->k_start = 0;
      tile->k_seq_start = tile->seq_start;
      if (p.k_starts != nullptr) {
        tile->k_start = p.k_starts[tile->b];
        tile->k_seq_start += SequenceStart(p.k_starts, tile->b);
      }
    }
    tile->k_len = tile->k_start + tile->seqlen;
    // Causal: the tile's last row (position k_start + (m_block + 1) 128 - 1)
    // sees keys up to there; the key tiles past it are never loaded.
    const int all = (tile->k_len + kBlockN - 1) / kBlockN;
    tile->n_blocks = p.causal ? min(all, (tile->k_start + (tile->m_block + 1) * kBlockM + kBlockN - 1) / kBlockN) : all;
    return true;
  };

  if (warp < 4) {
    // Producer warpgroup: warp 0 picks the tiles and walks them, its lane 0
    // issues every copy (Q; then K0, K1, V0, K2, V1, ...: the order the
    // consumers need them).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (warp != 0) return;
    int it = 0, qi = 0;  // K/V tiles and Q tiles issued so far
    int r = 0, k = 0;    // tiles taken, published
    // This CTA's next tile with rows, or -1 (only its length is read here;
    // the loop's top decodes it).
    auto take = [&]() {
      for (;;) {
        int t = n_tiles;
        if (p.sched == nullptr) {
          if (r < n_rounds) t = snake(r);
        } else if (r == 0) {
          t = cta;
        } else {
          int got = 0;
          if (lane == 0) got = atomicAdd(p.sched, 1) + grid;
          t = __shfl_sync(0xffffffffu, got, 0);
        }
        ++r;
        if (t >= n_tiles) return -1;
        // One sequence: every tile has rows (no load before the first copy).
        if (p.B == 1 || (p.m_blocks - 1 - t / heads_x_seqs) * kBlockM < p.seq_lens[t % heads_x_seqs / p.Hq]) return t;
      }
    };
    // Tile t (-1: no more) into the ring for the consumers.
    auto publish = [&](int t) {
      MbarWait(tile_empty(k), ((k / L::kRing) & 1) ^ 1);
      if (lane == 0) {
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile_slot(k)), "r"(t) : "memory");
        MbarArrive(tile_full(k));
      }
      ++k;
    };
    int t = take();
    publish(t);
    while (t >= 0) {
      Tile tile;
      decode(t, &tile, std::false_type{});
      const int kvh = tile.h / p.group;
      auto load_kv = [&](int i, bool is_v) {
        const int j = it + i, s = j % kStages;
        MbarWait(is_v ? v_empty(s) : k_empty(s), ((j / kStages) & 1) ^ 1);
        const uint32_t full = is_v ? v_full(s) : k_full(s);
        MbarExpectTx(full, L::kKVBytes);
        const int row = tile.k_seq_start + (tile.n_blocks - 1 - i) * kBlockN;
        const uint32_t dst = (is_v ? sV : sK) + s * L::kKVBytes;
#pragma unroll
        for (int a = 0; a < kAtoms; ++a) {
          TmaLoad3d(dst + a * kBlockN * kAtomBytes, is_v ? &tm_v : &tm_k, full, a * kAtomCols, kvh, row);
        }
      };
      if (lane == 0) {
        MbarWait(q_empty(qi), q_phase(qi) ^ 1);  // the consumers are done with this buffer's last Q
        MbarExpectTx(q_full(qi), L::kQBytes);
#pragma unroll
        for (int a = 0; a < kAtoms; ++a) {
          TmaLoad3d(q_buf(qi) + a * kBlockM * kAtomBytes, &tm_q, q_full(qi), a * kAtomCols, tile.h,
                    tile.seq_start + tile.m_block * kBlockM);
        }
        load_kv(0, false);
        for (int i = 0; i < tile.n_blocks; ++i) {
          if (i + 1 < tile.n_blocks) load_kv(i + 1, false);
          load_kv(i, true);
        }
      }
      it += tile.n_blocks;
      ++qi;
      // The next tile is taken once this one's last copy is out: greedy (the
      // CTA takes it as it is about to need it). The consumers read it under
      // this tile's last P V (not sooner: this waits for them to free stages).
      t = take();
      publish(t);
    }
    // Every CTA has taken its last tile once all have counted themselves
    // here: the last zeroes the counters for the next launch.
    if (p.sched != nullptr && lane == 0 && atomicAdd(p.sched + 1, 1) == grid - 1) {
      atomicExch(p.sched, 0);
      atomicExch(p.sched + 1, 0);
    }
    return;
  }

  // Consumer warpgroups.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int wg = warp / 4 - 1, wq = warp % 4;
  const float scale_log2 = p.scale_log2;
  float o[kORegs];
  float s[kSRegs];
  uint32_t pa[kPSteps][4];
  float row_max[2], row_sum[2];
  int it = 0, qi = 0;

  auto qk = [&](int stage) {
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t qa = q_buf(qi) + (kk / 4) * kBlockM * kAtomBytes + wg * 64 * kAtomBytes + (kk % 4) * 32;
      const uint32_t kb = sK + stage * L::kKVBytes + (kk / 4) * kBlockN * kAtomBytes + (kk % 4) * 32;
      WgmmaSS<T, kBlockN>(s, Desc(qa, 16, 1024), Desc(kb, 16, 1024), kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
  };
  auto pv = [&](int stage) {
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint32_t vb = sV + stage * L::kKVBytes + kk * 16 * kAtomBytes;
      WgmmaRS<T, kD>(o, pa[kk], Desc(vb, kBlockN * kAtomBytes, 1024), 1);
    }
    WgmmaCommit();
  };
  auto rescale = [&](const float(&alpha)[2]) {
    // Once the running maxima settle most tiles move no row's max.
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) {
      o[4 * i] *= alpha[0];
      o[4 * i + 1] *= alpha[0];
      o[4 * i + 2] *= alpha[1];
      o[4 * i + 3] *= alpha[1];
    }
  };
  // The S accumulator layout of two n8 tiles is the A fragment of one k16 step.
  auto to_p = [&]() {
#pragma unroll
    for (int j = 0; j < kPSteps; ++j) {
      pa[j][0] = Pack2<T>(s[8 * j], s[8 * j + 1]);
      pa[j][1] = Pack2<T>(s[8 * j + 2], s[8 * j + 3]);
      pa[j][2] = Pack2<T>(s[8 * j + 4], s[8 * j + 5]);
      pa[j][3] = Pack2<T>(s[8 * j + 6], s[8 * j + 7]);
    }
  };
  auto release = [&](uint32_t barrier) {
    if (lane == 0) MbarArrive(barrier);
  };
  // Ping-pong (kSched 2): named barrier 1 + w is warpgroup w's turn to issue.
  // The other warpgroup arrives on it after issuing its own GEMMs; warpgroup
  // 1 arrives once up front so warpgroup 0 goes first.
  auto my_turn = [&]() {
    if constexpr (kSched == 2) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
  };
  auto their_turn = [&]() {
    if constexpr (kSched == 2) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory");
  };
  if (wg == 1) their_turn();

  // The CTA's next tile from the ring, decoded into *tile; false: no more.
  int k_read = 0;  // ring entries read
  auto read_tile = [&](Tile* tile) {
    MbarWait(tile_full(k_read), (k_read / L::kRing) & 1);
    int t = 0;
    if (lane == 0) asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(t) : "r"(tile_slot(k_read)) : "memory");
    t = __shfl_sync(0xffffffffu, t, 0);
    release(tile_empty(k_read));
    ++k_read;
    return t >= 0 && decode(t, tile, std::true_type{});
  };
  Tile tile{}, next{};
  bool have = read_tile(&tile), have_next = false;
  // The next tile's decode (global loads) runs under the tile's last P V: the
  // producer publishes that tile once it has issued this tile's last copy
  // (the V that P V reads), so the latest point gives its take the most time
  // (ncu at locked clocks, H200, against the read under the last S: B=4
  // S=2048 -6%, B=8 S=1024 -6%, one call). Tiles of fewer than kLatePrefetch key
  // tiles read it under their last S instead: their last P V is too short to
  // hide the decode. The in-order schedule (o0, the default for short
  // multi-wave batches and for D=64 below 4096 tokens) reads under the last
  // S at D=128 (B=4 S=512: +2-3% under the last P V) and under the last P V at
  // D=64 (B=4 S=2048: -2% against under the last S); one point each (two
  // made ptxas spill at D=128).
  constexpr int kLatePrefetch = 3;
  auto prefetch_next = [&]() { have_next = read_tile(&next); };
  while (have) {
    const int seqlen = tile.seqlen, n_blocks = tile.n_blocks, k_start = tile.k_start, k_len = tile.k_len;
    const int wg_row_min = tile.m_block * kBlockM + wg * 64;               // first query row of this warpgroup
    const int row0 = wg_row_min + wq * 16 + (lane >> 2), row1 = row0 + 8;  // this thread's two rows
#pragma unroll
    for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;

    // Masks tile nb's scores, updates the running max/sum, turns s into
    // unnormalized probabilities; alpha: the factor O must be rescaled by.
    // Query row r is key position k_start + r (the mask's diagonal is
    // bottom-right aligned), so with k_start % 128 != 0 two key tiles cross it.
    auto softmax = [&](int nb, float(&alpha)[2]) {
      const int key0 = nb * kBlockN;
      if (key0 + kBlockN > k_len || (p.causal && key0 + kBlockN - 1 > k_start + wg_row_min)) {
        if constexpr (kD == 128) {
          // Key col is masked when col > min(row if causal, k_len - 1): one
          // compare of a compile-time offset against a per-row limit a score
          // (two compares and the column's arithmetic cost ~4 instructions a
          // score on a tile whose softmax runs under no GEMM of its
          // warpgroup). ncu at locked clocks: B=4 S=2048 and B=8 S=1024 1-2%
          // faster at D=128; at D=64 it made B=4 S=2048 3.5% slower, so that
          // head dim keeps the per-score form.
          const int col0 = key0 + 2 * (lane & 3);
          int lim[2];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int row = k_start + (half == 0 ? row0 : row1);
            lim[half] = min(p.causal ? row : k_len - 1, k_len - 1) - col0;
          }
#pragma unroll
          for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              if (i * 8 + (e & 1) > lim[e >> 1]) s[4 * i + e] = -INFINITY;
            }
          }
        } else {
#pragma unroll
          for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int col = key0 + i * 8 + 2 * (lane & 3) + (e & 1);
              const int row = k_start + (e < 2 ? row0 : row1);
              if (col >= k_len || (p.causal && col > row)) s[4 * i + e] = -INFINITY;
            }
          }
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < kBlockN / 8; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * half], s[4 * i + 2 * half + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(row_max[half], mx * scale_log2);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // fully masked so far: p = 0, no NaN
        alpha[half] = FastExp2(row_max[half] - m_use);
        row_max[half] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < kBlockN / 8; ++i) {
          s[4 * i + 2 * half] = FastExp2(fmaf(s[4 * i + 2 * half], scale_log2, -m_use));
          s[4 * i + 2 * half + 1] = FastExp2(fmaf(s[4 * i + 2 * half + 1], scale_log2, -m_use));
          sum += s[4 * i + 2 * half] + s[4 * i + 2 * half + 1];
        }
        row_sum[half] = row_sum[half] * alpha[half] + sum;
      }
    };

    MbarWait(q_full(qi), q_phase(qi));
    if constexpr (kSched == 0) {
      for (int i = 0; i < n_blocks; ++i) {
        const int j = it + i, stage = j % kStages;
        const uint32_t parity = (j / kStages) & 1;
        MbarWait(k_full(stage), parity);
        qk(stage);
        if (kD == 128 && i == n_blocks - 1) prefetch_next();  // (in-order: see kLatePrefetch)
        WgmmaWait<0>();
        FenceRegs(s);
        release(k_empty(stage));
        if (i == n_blocks - 1) release(q_empty(qi));
        float alpha[2];
        softmax(n_blocks - 1 - i, alpha);
        rescale(alpha);
        to_p();
        MbarWait(v_full(stage), parity);
        pv(stage);
        if (kD == 64 && i == n_blocks - 1) prefetch_next();
        WgmmaWait<0>();
        FenceRegs(o);
        FenceRegs(pa);
        release(v_empty(stage));
      }
    } else {
      int stage = it % kStages;
      MbarWait(k_full(stage), (it / kStages) & 1);
      my_turn();
      qk(stage);
      their_turn();
      if (n_blocks == 1) prefetch_next();  // (the last S is this first one)
      WgmmaWait<0>();
      FenceRegs(s);
      release(k_empty(stage));
      {
        float alpha[2];
        softmax(n_blocks - 1, alpha);  // O is still zero: nothing to rescale
      }
      to_p();
      for (int i = 1; i < n_blocks; ++i) {
        const int j = it + i, prev = (j - 1) % kStages;
        stage = j % kStages;
        MbarWait(k_full(stage), (j / kStages) & 1);
        MbarWait(v_full(prev), ((j - 1) / kStages) & 1);
        my_turn();
        qk(stage);
        pv(prev);
        their_turn();
        if (i == n_blocks - 1 && n_blocks < kLatePrefetch) prefetch_next();
        WgmmaWait<1>();  // S(i) is done; P(i-1) V(i-1) may still run
        FenceRegs(s);
        release(k_empty(stage));
        float alpha[2];
        softmax(n_blocks - 1 - i, alpha);
        WgmmaWait<0>();
        FenceRegs(o);
        FenceRegs(pa);
        release(v_empty(prev));
        rescale(alpha);
        to_p();
      }
      release(q_empty(qi));  // every S of this tile is done
      const int j = it + n_blocks - 1;
      stage = j % kStages;
      MbarWait(v_full(stage), (j / kStages) & 1);
      my_turn();
      pv(stage);
      their_turn();
      if (n_blocks >= kLatePrefetch) prefetch_next();
      WgmmaWait<0>();
      FenceRegs(o);
      FenceRegs(pa);
      release(v_empty(stage));
    }
    it += n_blocks;
    ++qi;

    // Normalize and store the rows inside the sequence.
    T* gO = static_cast<T*>(p.o) + (static_cast<int64_t>(tile.seq_start) * p.Hq + tile.h) * kD;
    float inv[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = row_sum[half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv[half] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
    if constexpr (L::kStageO) {  // (only when asked for and it fits)
      // Each warp stages its 16 rows (16-byte chunks XOR-swizzled by row, so
      // the 8 rows a store instruction touches hit different banks), then
      // writes whole rows with 16-byte stores.
      constexpr int kChunks = kD / 8;  // 16-byte chunks per row
      uint8_t* const wO = sO + (wg * 64 + wq * 16) * kD * 2;
      const int g = lane >> 2;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = g + 8 * half;
#pragma unroll
        for (int i = 0; i < kChunks; ++i) {
          *reinterpret_cast<uint32_t*>(wO + r * kD * 2 + ((i ^ (r & 7)) << 4) + 4 * (lane & 3)) =
              Pack2<T>(o[4 * i + 2 * half] * inv[half], o[4 * i + 2 * half + 1] * inv[half]);
        }
      }
      __syncwarp();
      constexpr int kRowsPerPass = 32 / kChunks;
      const int c = lane % kChunks;
      const int warp_row0 = tile.m_block * kBlockM + wg * 64 + wq * 16;
#pragma unroll
      for (int pass = 0; pass < 16 / kRowsPerPass; ++pass) {
        const int r = pass * kRowsPerPass + lane / kChunks;
        const uint4 v = *reinterpret_cast<const uint4*>(wO + r * kD * 2 + ((c ^ (r & 7)) << 4));
        if (warp_row0 + r < seqlen) {
          *reinterpret_cast<uint4*>(gO + static_cast<int64_t>(warp_row0 + r) * p.Hq * kD + c * 8) = v;
        }
      }
      __syncwarp();  // the next tile's staging waits for these reads
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = half == 0 ? row0 : row1;
        if (row < seqlen) {
          T* dst = gO + static_cast<int64_t>(row) * p.Hq * kD + 2 * (lane & 3);
#pragma unroll
          for (int i = 0; i < kD / 8; ++i) {
            *reinterpret_cast<uint32_t*>(dst + 8 * i) =
                Pack2<T>(o[4 * i + 2 * half] * inv[half], o[4 * i + 2 * half + 1] * inv[half]);
          }
        }
      }
    }
    tile = next;
    have = have_next;
  }
  if (wg == 0) my_turn();  // takes warpgroup 1's last arrival: no barrier left pending
}

// ---- host side ------------------------------------------------------------------

// A [T, H, D] tensor as a 3D map (column, head, row) with boxes of 64
// columns x 1 head x `rows` rows, 128B-swizzled; rows past T read as zeros.
CudaStatus EncodeMap(CUtensorMap* map, DType dtype, const void* ptr, int64_t T, int H, int D, int rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return CudaStatus::Error("attention_hopper: cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D) * 2, static_cast<cuuint64_t>(H) * D * 2};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kAtomCols), 1, static_cast<cuuint32_t>(rows)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r =
      encode(map, dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
             const_cast<void*>(ptr), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return CudaStatus::Error("attention_hopper: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(r) + ")");
  }
  return CudaStatus::Ok();
}

template <typename T, int kD, int kStages, int kSched, bool kStageO, int kQBufs = 1>
CudaStatus LaunchKernel(const CUtensorMap& q, const CUtensorMap& k, const CUtensorMap& v, const HopperParams& hp,
                        dim3 grid, cudaStream_t stream) {
  auto kernel = HopperFlashKernel<T, kD, kStages, kSched, kStageO, kQBufs>;
  constexpr int kSmem = HopperLayout<kD, kStages, kStageO, kQBufs>::kBytes;
  if (CudaStatus s = FS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      !s.ok())
    return s;
  kernel<<<grid, kThreads, kSmem, stream>>>(q, k, v, hp);
  return FS_CUDA_CHECK_LAUNCH();
}

// The dynamic tile scheduler's counters for launches on `stream` (see
// HopperParams::sched): one zeroed pair per (device, stream), made on first
// use and kept; launches on one stream never overlap, and each leaves them
// zero. Null (the static order) under FUSEDSERVE_ATTN_TILE_SCHED=0, while the
// stream is capturing a graph (a replay may run beside the stream's own
// launches) and where they cannot be made.
int* TileCounters(cudaStream_t stream) {
  static const bool dynamic = EnvKnob("FUSEDSERVE_ATTN_TILE_SCHED", 0, 1, 1) == 1;
  // cudaStreamPerThread names a different stream on each thread.
  if (!dynamic || stream == cudaStreamPerThread) return nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return nullptr;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  static std::mutex mu;
  // Never destroyed: launches may run until the process exits.
  static auto* counters = new std::map<std::pair<int, cudaStream_t>, DeviceBuffer>();
  std::lock_guard<std::mutex> lock(mu);
  DeviceBuffer& c = (*counters)[{device, stream}];
  if (c.get() == nullptr) {
    if (!c.Allocate(2 * sizeof(int)).ok() || cudaMemsetAsync(c.get(), 0, 2 * sizeof(int), stream) != cudaSuccess) {
      cudaGetLastError();
      c.Free();
      return nullptr;
    }
  }
  return c.as<int>();
}

// The built variants (HopperAttentionBuilt).
template <typename T, int kD>
CudaStatus LaunchHeadDim(const CUtensorMap& q, const CUtensorMap& k, const CUtensorMap& v, const HopperParams& hp,
                         dim3 grid, const HopperKnobs& c, cudaStream_t stream) {
  if (c.stages == 3) return LaunchKernel<T, kD, 3, 1, true>(q, k, v, hp, grid, stream);
  if (c.q_bufs == 2) {
    return c.sched == 1 ? LaunchKernel<T, kD, 2, 1, true, 2>(q, k, v, hp, grid, stream)
                        : LaunchKernel<T, kD, 2, 2, true, 2>(q, k, v, hp, grid, stream);
  }
  switch (c.sched * 2 + (c.stage_o ? 1 : 0)) {
    case 1:
      return LaunchKernel<T, kD, 2, 0, true>(q, k, v, hp, grid, stream);
    case 2:
      return LaunchKernel<T, kD, 2, 1, false>(q, k, v, hp, grid, stream);
    case 3:
      return LaunchKernel<T, kD, 2, 1, true>(q, k, v, hp, grid, stream);
    case 4:
      return LaunchKernel<T, kD, 2, 2, false>(q, k, v, hp, grid, stream);
    default:
      return LaunchKernel<T, kD, 2, 2, true>(q, k, v, hp, grid, stream);
  }
}

template <typename T>
CudaStatus LaunchDtype(const CUtensorMap& q, const CUtensorMap& k, const CUtensorMap& v, const HopperParams& hp,
                       dim3 grid, int D, const HopperKnobs& c, cudaStream_t stream) {
  return D == 128 ? LaunchHeadDim<T, 128>(q, k, v, hp, grid, c, stream)
                  : LaunchHeadDim<T, 64>(q, k, v, hp, grid, c, stream);
}

}  // namespace

bool HopperAttentionAvailable() { return (HopperDeviceInfo() & 1) != 0; }

bool HopperAttentionBuilt(const HopperKnobs& c) {
  if (c.q_bufs != 1) return c.q_bufs == 2 && c.stages == 2 && (c.sched == 1 || c.sched == 2) && c.stage_o;
  if (c.stages == 3) return c.sched == 1 && c.stage_o;
  return c.stages == 2 && ((c.sched == 0 && c.stage_o) || c.sched == 1 || c.sched == 2);
}

bool HopperAttentionSupports(DType dtype, int D) {
  return (dtype == DType::kBF16 || dtype == DType::kF16) && (D == 64 || D == 128);
}

CudaStatus LaunchAttentionHopper(const AttentionParams& a, const HopperKnobs& c, cudaStream_t stream) {
  if (!HopperAttentionSupports(a.dtype, a.D)) {
    return CudaStatus::Unsupported("attention_hopper: needs bf16/fp16 and head dim 64 or 128");
  }
  if (!HopperAttentionBuilt(c)) {
    return CudaStatus::Error("attention_hopper: no kernel with " + std::to_string(c.stages) + " stages, schedule " +
                             std::to_string(c.sched) + (c.stage_o ? ", staged O" : ", direct O") + " and " +
                             std::to_string(c.q_bufs) + " Q buffers");
  }
  if (a.Hkv <= 0 || a.Hq % a.Hkv != 0) return CudaStatus::Error("attention: Hq must be a multiple of Hkv");
  if (a.T == 0 || a.B == 0 || a.max_seqlen == 0) return CudaStatus::Ok();
  if (!Aligned16(a.q) || !Aligned16(a.k) || !Aligned16(a.v) || !Aligned16(a.o)) {
    return CudaStatus::Error("attention: q, k, v, o must be 16-byte aligned");
  }
  if (a.B > 65535 || a.Hq > 65535) return CudaStatus::Error("attention: B and Hq must be <= 65535");
  if (a.k_starts != nullptr && a.Tk < a.T) return CudaStatus::Error("attention: k_starts need Tk >= T key rows");
  const int Tk = a.k_starts != nullptr ? a.Tk : a.T;
  CUtensorMap q, k, v;
  if (CudaStatus s = EncodeMap(&q, a.dtype, a.q, a.T, a.Hq, a.D, kBlockM); !s.ok()) return s;
  if (CudaStatus s = EncodeMap(&k, a.dtype, a.k, Tk, a.Hkv, a.D, kBlockN); !s.ok()) return s;
  if (CudaStatus s = EncodeMap(&v, a.dtype, a.v, Tk, a.Hkv, a.D, kBlockN); !s.ok()) return s;
  const int m_blocks = (a.max_seqlen + kBlockM - 1) / kBlockM;
  const int64_t tiles = static_cast<int64_t>(m_blocks) * a.Hq * a.B;
  if (tiles > (int64_t{1} << 31) - 1) return CudaStatus::Error("attention_hopper: too many query tiles");
  // Persistent: one CTA per SM (the shared memory allows no second).
  const int ctas = static_cast<int>(std::min<int64_t>(tiles, std::max(1, HopperDeviceInfo() >> 1)));
  // One wave (a tile per CTA) needs no scheduler: the atomics would only
  // add their latency (B=1 S=512: +5.8% at locked clocks).
  int* const counters = tiles > ctas && tiles + ctas < (int64_t{1} << 31) ? TileCounters(stream) : nullptr;
  const HopperParams hp{a.o,          a.seq_lens, a.k_starts,       a.B,      a.Hq,
                        a.Hq / a.Hkv, m_blocks,   a.scale * kLog2e, a.causal, counters};
  const dim3 grid(static_cast<unsigned>(ctas));
  if (a.dtype == DType::kBF16) return LaunchDtype<__nv_bfloat16>(q, k, v, hp, grid, a.D, c, stream);
  return LaunchDtype<__half>(q, k, v, hp, grid, a.D, c, stream);
}

}  // namespace fusedserve::cuda
