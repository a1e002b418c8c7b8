// The fused SwiGLU gate GEMM on Hopper (swiglu_hopper.h): wgmma fed by TMA.
// CTA tile: 128 rows of x by 128 columns of h, i.e. 128 gate rows and the
// matching 128 up rows of gate_up, loaded by two TMA boxes into one 256-row
// B tile, so one wgmma m64n256k16 per warpgroup and k-step computes both;
// the accumulator's column c (gate) and c+128 (up) sit in the same thread
// (registers i and i+64), and the epilogue writes silu(gate) * up.
// Warp specialization: warpgroup 0 is the producer (one thread issues TMA
// into a 4-stage ring of 128B-swizzled shared memory, full/empty mbarriers),
// warpgroups 1 and 2 consume 64 rows each; setmaxnreg moves registers from
// the producer to the consumers (128 fp32 accumulators each). The epilogue
// packs silu(gate) * up into registers, starts the next tile's wgmmas, and
// only then writes the packed h tile to swizzled shared memory and issues
// its TMA stores, which overlap that tile's main loop. Persistent grid (one
// CTA per SM) walking the tiles row-fastest in groups (TileOrigin), so the
// CTAs of a wave share tiles in L2; the producer prefetches the next tile
// while the consumers finish the last one.
// Optional 2-CTA clusters share the weight tile by TMA multicast (off by
// default: measured slower, see swiglu_hopper.h).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <mutex>
#include <string>

#include "kernels/cuda/sm90a/hopper.cuh"
#include "kernels/cuda/swiglu_hopper.h"

namespace fusedserve::cuda {
namespace {

constexpr int kBM = 128;  // rows of x per CTA (2 consumer warpgroups x 64)
constexpr int kBN = 128;  // columns of h per CTA (gate and up: 256 B rows)
constexpr int kBK = 64;   // 64 bf16 = 128 bytes: one swizzle row
constexpr int kStages = 4;
constexpr int kThreads = 384;               // producer warpgroup + 2 consumers
constexpr int kABytes = kBM * kBK * 2;      // 16 KiB
constexpr int kBBytes = 2 * kBN * kBK * 2;  // 32 KiB (gate then up)
constexpr int kOutBytes = kBM * kBN * 2;    // 32 KiB: the h tile on its way to a TMA store
constexpr int kSmemBytes = kStages * (kABytes + kBBytes) + kOutBytes + 2 * kStages * 8 + 1024;  // + barriers, alignment

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The same box into this CTA and its cluster peer (same shared-memory
// offsets), completing on each CTA's own mbarrier at `bar`.
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void TmaStore2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until the bulk stores issued by this thread have read shared memory.
__device__ __forceinline__ void BulkWaitRead() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void BulkWait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Arrive on the mbarrier at the same offset in CTA `rank` of the cluster.
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

// Keeps the compiler from moving accumulator reads across the waits.
__device__ __forceinline__ void FenceOperand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

__device__ __forceinline__ void WgmmaBf16(float* d, uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, "
      "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "
      "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "
      "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void WgmmaF16(float* d, uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, "
      "%68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, "
      "%90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, "
      "%110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]),
        "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b), "r"(scale_d));
}

template <typename T>
struct Ops;
template <>
struct Ops<__nv_bfloat16> {
  static __device__ __forceinline__ void Mma(float* d, uint64_t a, uint64_t b, int s) { WgmmaBf16(d, a, b, s); }
  static __device__ __forceinline__ uint32_t Pack(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};
template <>
struct Ops<__half> {
  static __device__ __forceinline__ void Mma(float* d, uint64_t a, uint64_t b, int s) { WgmmaF16(d, a, b, s); }
  static __device__ __forceinline__ uint32_t Pack(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// Tile t of the persistent walk: groups of group_m row tiles, rows fastest
// inside a group, so a wave's CTAs share both x and weight tiles in L2.
// Returns the row tile's index (of a cluster's rows) and the first column.
__device__ __forceinline__ void TileOrigin(int t, int m_tiles, int n_tiles, int group_m, int* mt, int* n0) {
  const int per_group = group_m * n_tiles;
  const int first_m = (t / per_group) * group_m, r = t % per_group;
  const int gm = min(group_m, m_tiles - first_m);
  *mt = first_m + r % gm;
  *n0 = (r / gm) * kBN;
}

// silu(g) * u with one MUFU op: silu(g) = g/2 * (1 + tanh(g/2)). The
// epilogue is bound by the quarter-rate MUFU pipe while the tensor cores
// idle; exp and a reciprocal were two ops an element.
__device__ __forceinline__ float SiluMul(float g, float u) {
  const float hg = 0.5f * g;
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(hg));
  return fmaf(hg, t, hg) * u;
}

// kCluster 2: CTA pairs of one cluster take vertically adjacent tiles with
// the same columns; each loads its own x tile and one half of the weight
// tile (rank 0 gate, rank 1 up), multicast into both, so each weight byte
// crosses L2 once per pair. A stage is free again only when the consumers
// of both CTAs are done with it (16 arrivals on each CTA's empty barrier).
template <typename T, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    SwigluGateKernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_gate,
                     const __grid_constant__ CUtensorMap map_up, const __grid_constant__ CUtensorMap map_h, int M,
                     int I, int D, int group_m) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t a_base = SmemAddr(smem);
  const uint32_t b_base = a_base + kStages * kABytes;
  const uint32_t out_base = b_base + kStages * kBBytes;  // 2 x (64 rows x 256 B), two 128 B-wide boxes each
  const uint32_t full_bar = out_base + kOutBytes;        // kStages x 8 bytes
  const uint32_t empty_bar = full_bar + kStages * 8;

  const uint32_t rank = kCluster > 1 ? ClusterRank() : 0;
  const int m_tiles = (M + kBM - 1) / kBM;
  const int mp_tiles = (m_tiles + kCluster - 1) / kCluster;  // row tiles of a cluster
  const int n_tiles = (I + kBN - 1) / kBN;
  const int k_tiles = (D + kBK - 1) / kBK;
  const int tiles = mp_tiles * n_tiles;
  const int first = blockIdx.x / kCluster, step = gridDim.x / kCluster;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_bar + 8 * s, 1);
      MbarInit(empty_bar + 8 * s, 8 * kCluster);  // lane 0 of each consumer warp of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (kCluster > 1) {
    ClusterSync();  // the peer's barriers exist before anything lands in them
  } else {
    __syncthreads();
  }

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int t = first; t < tiles; t += step) {
        int mp, n0;
        TileOrigin(t, mp_tiles, n_tiles, group_m, &mp, &n0);
        const int m0 = (mp * kCluster + static_cast<int>(rank)) * kBM;
        for (int kt = 0; kt < k_tiles; ++kt) {
          MbarWait(empty_bar + 8 * stage, phase ^ 1);
          const uint32_t fb = full_bar + 8 * stage;
          MbarExpectTx(fb, kABytes + kBBytes);
          const uint32_t b = b_base + stage * kBBytes;
          TmaLoad2d(a_base + stage * kABytes, &map_x, kt * kBK, m0, fb);
          if constexpr (kCluster > 1) {
            TmaLoad2dMulticast(b + rank * (kBBytes / 2), rank == 0 ? &map_gate : &map_up, kt * kBK, n0, fb, 0x3);
          } else {
            TmaLoad2d(b, &map_gate, kt * kBK, n0, fb);
            TmaLoad2d(b + kBBytes / 2, &map_up, kt * kBK, n0, fb);
          }
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1;  // rows cw*64 .. cw*64+63 of the tile
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const bool leader = threadIdx.x % 128 == 0;
    const uint32_t out = out_base + cw * (kOutBytes / 2);
    // h of the previous tile, packed, on its way out: it is written to shared
    // memory and stored while this tile's first wgmmas run.
    uint32_t packed[32];
    int pending_row0 = -1, pending_n0 = 0;
    auto store_pending = [&] {
      if (leader) BulkWaitRead();  // the stores before have read the buffer
      NamedBarrier(1 + cw, 128);
      // The layout of the output tensor map's 128B-swizzled 64 x 64 boxes.
      // Accumulator register i: row warp*16 + lane/4 + 8*((i>>1)&1), column
      // (i>>2)*8 + (lane%4)*2 + (i&1); packed[j*2+r] holds registers
      // i = j*4 + r*2 and i+1. Row % 8 is lane/4, so the swizzled 16-byte
      // chunk is (column chunk) ^ (lane/4): no bank conflicts.
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = warp * 16 + lane / 4 + 8 * r;
          const uint32_t addr = out + (j / 8) * 8192 + row * 128 + (((j % 8) ^ (lane / 4)) * 16) + (lane % 4) * 4;
          asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(packed[j * 2 + r]) : "memory");
        }
      }
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // visible to the TMA engine
      NamedBarrier(1 + cw, 128);
      if (leader && pending_row0 < M) {
        TmaStore2d(&map_h, out, pending_n0, pending_row0);
        if (pending_n0 + 64 < I) TmaStore2d(&map_h, out + 8192, pending_n0 + 64, pending_row0);
        BulkCommit();
      }
      pending_row0 = -1;
    };
    int stage = 0;
    uint32_t phase = 0;
    float acc[128];
    for (int t = first; t < tiles; t += step) {
      int mp, n0;
      TileOrigin(t, mp_tiles, n_tiles, group_m, &mp, &n0);
      const int m0 = (mp * kCluster + static_cast<int>(rank)) * kBM;
      int prev = -1;
      for (int kt = 0; kt < k_tiles; ++kt) {
        MbarWait(full_bar + 8 * stage, phase);
        const uint64_t da = SmemDesc(a_base + stage * kABytes + cw * 64 * 128);
        const uint64_t db = SmemDesc(b_base + stage * kBBytes);
#pragma unroll
        for (int i = 0; i < 128; ++i) FenceOperand(acc[i]);
        WgmmaFence();
        // A tile's first wgmma starts from zero (scale-d 0): no register
        // clearing between the previous tile's epilogue and this issue.
#pragma unroll
        for (int k = 0; k < kBK / 16; ++k) Ops<T>::Mma(acc, da + 2 * k, db + 2 * k, kt > 0 || k > 0 ? 1 : 0);
        WgmmaCommit();
#pragma unroll
        for (int i = 0; i < 128; ++i) FenceOperand(acc[i]);
        if (kt == 0 && pending_row0 >= 0) store_pending();  // under this tile's first wgmmas
        // The previous stage's wgmmas are done once at most this group is
        // pending: hand that stage back to the producer(s).
        WgmmaWait<1>();
        if (prev >= 0 && lane == 0) {
          if constexpr (kCluster > 1) {
            MbarArriveCluster(empty_bar + 8 * prev, 0);
            MbarArriveCluster(empty_bar + 8 * prev, 1);
          } else {
            MbarArrive(empty_bar + 8 * prev);
          }
        }
        prev = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < 128; ++i) FenceOperand(acc[i]);
      if (prev >= 0 && lane == 0) {
        if constexpr (kCluster > 1) {
          MbarArriveCluster(empty_bar + 8 * prev, 0);
          MbarArriveCluster(empty_bar + 8 * prev, 1);
        } else {
          MbarArrive(empty_bar + 8 * prev);
        }
      }
      // Epilogue, first half: silu(gate) * up (up's column c+128 is register
      // i+64), packed; the stores wait for the next tile's first wgmmas.
#pragma unroll
      for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = j * 4 + r * 2;
          packed[j * 2 + r] = Ops<T>::Pack(SiluMul(acc[i], acc[i + 64]), SiluMul(acc[i + 1], acc[i + 65]));
        }
      }
      pending_row0 = m0 + cw * 64;
      pending_n0 = n0;
    }
    if (pending_row0 >= 0) store_pending();
    if (leader) BulkWait();
  }
  if constexpr (kCluster > 1) {
    __syncwarp();
    ClusterSync();  // no CTA leaves while its peer may still signal its barriers
  }
}

struct DeviceInfo {
  bool queried = false;
  bool hopper = false;
  int sms = 0;
  bool prepared[2][2] = {};  // [dtype][cluster - 1]: shared-memory limit raised
  int max_clusters[2] = {};  // [dtype]: co-resident 2-CTA clusters (0: none)
};

std::mutex g_mu;
DeviceInfo g_devices[64];

// Compute capability and SM count of `device`, queried once.
DeviceInfo* Info(int device) {
  if (device < 0 || device >= 64) return nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceInfo& d = g_devices[device];
  if (!d.queried) {
    int major = 0, minor = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    d.queried = true;
    d.hopper = major == 9 && minor == 0;
    d.sms = sms;
  }
  return &d;
}

CudaStatus MakeMap(CUtensorMap* map, DType dt, const void* base, int64_t rows, int64_t cols, int box_rows) {
  static_assert(kBK == 64, "EncodeRowMajorMap's boxes are 64 columns wide");
  return EncodeRowMajorMap(map, dt, base, rows, cols, box_rows, "swiglu_hopper");
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

bool HopperSwigluSupported(DType dt, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up,
                           const void* h) {
  if (dt != DType::kBF16 && dt != DType::kF16) return false;
  if (M < 1 || D < 8 || I < 8 || D % 8 != 0 || I % 8 != 0) return false;
  if (M > (int64_t{1} << 31) - 1 || D > (int64_t{1} << 31) - 1 || I > (int64_t{1} << 30) - 1) return false;
  if (!Aligned16(x) || !Aligned16(gate_up) || !Aligned16(h)) return false;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const DeviceInfo* info = Info(device);
  return info != nullptr && info->hopper;
}

namespace {

template <typename T, int kCluster>
CudaStatus Launch(DeviceInfo* info, int di, const CUtensorMap& mx, const CUtensorMap& mg, const CUtensorMap& mu,
                  const CUtensorMap& mh, int M, int I, int D, int group_m, int64_t tiles, cudaStream_t stream) {
  auto kernel = &SwigluGateKernel<T, kCluster>;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!info->prepared[di][kCluster - 1]) {
      if (CudaStatus s =
              FS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
          !s.ok())
        return s;
      if (kCluster > 1) {
        int n = 0;
        if (CudaStatus s = MaxActiveClusters(kernel, kCluster, kThreads, kSmemBytes, &n); !s.ok()) return s;
        info->max_clusters[di] = n;
      }
      info->prepared[di][kCluster - 1] = true;
    }
  }
  if (kCluster > 1 && info->max_clusters[di] == 0) {  // no 2-CTA cluster fits: the plain kernel
    return Launch<T, 1>(info, di, mx, mg, mu, mh, M, I, D, group_m, tiles, stream);
  }
  // Persistent grid: one CTA per SM (as many clusters as fit at once).
  const int64_t units = (tiles + kCluster - 1) / kCluster * kCluster;
  const int64_t resident = kCluster > 1 ? int64_t{info->max_clusters[di]} * kCluster : info->sms;
  const int grid = static_cast<int>(units < resident ? units : resident);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = kCluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = kCluster > 1 ? 1 : 0;
  return FS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, mx, mg, mu, mh, M, I, D, group_m));
}

}  // namespace

CudaStatus LaunchHopperSwiglu(DType dt, int64_t M, int64_t D, int64_t I, const void* x, const void* gate_up, void* h,
                              cudaStream_t stream, const HopperSwigluOptions& o) {
  if (!HopperSwigluSupported(dt, M, D, I, x, gate_up, h)) {
    return CudaStatus::Unsupported(
        "swiglu_hopper: needs a compute capability 9.0 device, bf16/fp16, D and I multiples "
        "of 8 and 16-byte aligned pointers (got M=" +
        std::to_string(M) + " D=" + std::to_string(D) + " I=" + std::to_string(I) + ")");
  }
  int device = 0;
  if (CudaStatus s = FS_CUDA_CHECK(cudaGetDevice(&device)); !s.ok()) return s;
  DeviceInfo* info = Info(device);
  CUtensorMap mx, mg, mu, mh;
  if (CudaStatus s = MakeMap(&mx, dt, x, M, D, kBM); !s.ok()) return s;
  if (CudaStatus s = MakeMap(&mg, dt, gate_up, I, D, kBN); !s.ok()) return s;
  const void* up = static_cast<const uint8_t*>(gate_up) + static_cast<size_t>(I) * D * 2;
  if (CudaStatus s = MakeMap(&mu, dt, up, I, D, kBN); !s.ok()) return s;
  if (CudaStatus s = MakeMap(&mh, dt, h, M, I, 64); !s.ok()) return s;
  const int cluster = o.cluster == 2 ? 2 : 1;
  const int64_t m_tiles = (M + kBM - 1) / kBM;
  const int64_t mp_tiles = (m_tiles + cluster - 1) / cluster;
  const int64_t tiles = m_tiles * ((I + kBN - 1) / kBN);
  const int group = static_cast<int>(o.group_m <= 0 || o.group_m > mp_tiles ? mp_tiles : o.group_m);
  const int m = static_cast<int>(M), i = static_cast<int>(I), d = static_cast<int>(D);
  const int di = dt == DType::kBF16 ? 0 : 1;
  if (cluster == 2) {
    return dt == DType::kBF16 ? Launch<__nv_bfloat16, 2>(info, di, mx, mg, mu, mh, m, i, d, group, tiles, stream)
                              : Launch<__half, 2>(info, di, mx, mg, mu, mh, m, i, d, group, tiles, stream);
  }
  return dt == DType::kBF16 ? Launch<__nv_bfloat16, 1>(info, di, mx, mg, mu, mh, m, i, d, group, tiles, stream)
                            : Launch<__half, 1>(info, di, mx, mg, mu, mh, m, i, d, group, tiles, stream);
}

}  // namespace fusedserve::cuda
