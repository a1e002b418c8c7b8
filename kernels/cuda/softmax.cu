// Row softmax, one HBM read and one write per element for any row that fits
// the registers of up to 8 blocks.
//
// SoftmaxKernel<T, kN, kIters>:
//   - kN: 16-byte vectors or the scalar path (1);
//   - kIters > 0: a row segment is held in registers (kIters vectors per
//     thread): block max, then block sum of exp(x - max), from registers;
//   - kIters == 0: the segment streams through twice with an online
//     (max, sum) in the first pass.
// A row is split over a thread-block cluster of `cluster` blocks (Hopper):
// each block reduces its segment to (max, sum), publishes it in its shared
// memory, and after one cluster barrier every warp combines the partials it
// reads through distributed shared memory. That keeps N = 128256 bf16 (250 KB,
// more than one SM's registers or shared memory) at one read per element,
// where a two-kernel or re-read scheme moves 1.5-2x the bytes; at small row
// counts it also spreads one row over several SMs.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax.h"

namespace cg = cooperative_groups;

namespace fusedserve::cuda {
namespace {

constexpr int kMaxIters = 8;
constexpr int kMaxCluster = 8;        // the portable cluster size limit (defaults stay within it)
constexpr int kMaxClusterLarge = 16;  // H100's non-portable limit, for very long rows

constexpr int ItersBucket(int64_t iters) {
  return iters <= 1 ? 1 : iters <= 2 ? 2 : iters <= 4 ? 4 : iters <= kMaxIters ? 8 : 0;
}

struct SoftmaxArgs {
  SoftmaxParams p;
  int tpr;
  int rows_per_block;
  int cluster;
  int64_t seg;              // vectors per cluster rank
  int64_t prefetch_blocks;  // blocks [0, prefetch_blocks) prefetch their segments (vector path)
};

// Combines the (max, sum) of the `c` blocks of this cluster. Every thread of
// the block calls it with its block's result; every thread gets the row's.
// `part` alternates between two buffers from one row to the next: a peer
// reads buffer b of row i before it reaches the barrier of row i + 1, and
// buffer b is written again only after that barrier (row i + 2). The kernel
// ends with one more cluster barrier, so no block exits while a peer may
// still read its shared memory.
__device__ __forceinline__ MaxSum ClusterCombine(MaxSum t, int c, MaxSum* part) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *part = t;
  cluster.sync();
  const int lane = threadIdx.x & 31;
  MaxSum q = MaxSumOp::Identity();
  if (lane < c) q = *cluster.map_shared_rank(part, lane);
  return GroupReduce(q, MaxSumOp(), 32);
}

// One row segment: the block's `tpr` threads (of row `row`) over vectors
// [begin, end) of x; red/part are this row's buffers.
template <typename T, int kN, int kIters>
__device__ __forceinline__ void SoftmaxRow(const SoftmaxArgs& a, int64_t row, int lane, int64_t begin, int64_t end,
                                           MaxSum* red, MaxSum* part) {
  const SoftmaxParams& p = a.p;
  const int c = a.cluster;
  const int tpr = a.tpr;
  const bool active = row < p.rows;
  const int64_t off = active ? row * p.n : 0;
  const T* x = static_cast<const T*>(p.x) + off;  // [n]
  T* y = static_cast<T*>(p.y) + off;              // [n]

  if constexpr (kIters > 0) {
    Vec<T, kN> v[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t j = begin + lane + it * tpr;
      if (active && j < end) v[it].Load(x + j * kN);
    }
    // This thread's (max, sum exp(x - max)) from its registers, then one
    // (max, sum)-combining reduction over the row (one barrier round, not two).
    float m = -INFINITY;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t j = begin + lane + it * tpr;
      if (active && j < end) {
        float f[kN];
        v[it].ToFloats(f);
#pragma unroll
        for (int i = 0; i < kN; ++i) m = fmaxf(m, f[i]);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) v[it].Launder();
    float s = 0.0f;
    if (m != -INFINITY) {
#pragma unroll
      for (int it = 0; it < kIters; ++it) {
        const int64_t j = begin + lane + it * tpr;
        if (active && j < end) {
          float f[kN];
          v[it].ToFloats(f);
#pragma unroll
          for (int i = 0; i < kN; ++i) s += __expf(f[i] - m);
        }
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) v[it].Launder();
    MaxSum t = RowReduce(MaxSum{m, s}, MaxSumOp(), tpr, red);
    if (c > 1) t = ClusterCombine(t, c, part);
    const float inv = 1.0f / t.s;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t j = begin + lane + it * tpr;
      if (active && j < end) {
        float f[kN];
        v[it].ToFloats(f);
#pragma unroll
        for (int i = 0; i < kN; ++i) f[i] = __expf(f[i] - t.m) * inv;
        Vec<T, kN> o;
        o.FromFloats(f);
        o.Store(y + j * kN);
      }
    }
  } else {
    MaxSum t = MaxSumOp::Identity();
    if (active) {
      for (int64_t j = begin + lane; j < end; j += tpr) {
        Vec<T, kN> v;
        v.Load(x + j * kN);
        float f[kN];
        v.ToFloats(f);
        float vm = f[0];
#pragma unroll
        for (int i = 1; i < kN; ++i) vm = fmaxf(vm, f[i]);
        const float nm = fmaxf(t.m, vm);
        if (nm == -INFINITY) continue;
        float s = t.s * __expf(t.m - nm);
#pragma unroll
        for (int i = 0; i < kN; ++i) s += __expf(f[i] - nm);
        t = {nm, s};
      }
    }
    t = RowReduce(t, MaxSumOp(), tpr, red);
    if (c > 1) t = ClusterCombine(t, c, part);
    const float inv = 1.0f / t.s;
    if (active) {
      for (int64_t j = begin + lane; j < end; j += tpr) {
        Vec<T, kN> v;
        v.Load(x + j * kN);
        float f[kN];
        v.ToFloats(f);
#pragma unroll
        for (int i = 0; i < kN; ++i) f[i] = __expf(f[i] - t.m) * inv;
        v.FromFloats(f);
        v.Store(y + j * kN);
      }
    }
  }
}

// Clusters (c > 1) are persistent: the grid holds as many clusters as fit at
// once and each loops over rows, so a finished row does not wait for the
// scheduler to find c free slots in one GPC for the next cluster.
template <typename T, int kN, int kIters>
__global__ void __launch_bounds__(1024) SoftmaxKernel(const SoftmaxArgs a) {
  __shared__ MaxSum red[2][32];
  __shared__ MaxSum part[2];
  const int c = a.cluster;
  // A 1-D grid of 1-D clusters: consecutive blocks form a cluster.
  const int rank = c > 1 ? static_cast<int>(blockIdx.x % c) : 0;
  const int64_t first_block_row = c > 1 ? blockIdx.x / c : blockIdx.x;
  const int64_t stride = c > 1 ? gridDim.x / c : gridDim.x;
  const int64_t row_blocks = CeilDivDevice(a.p.rows, a.rows_per_block);
  const int rib = threadIdx.x / a.tpr;
  const int lane = threadIdx.x - rib * a.tpr;
  const int64_t nv = a.p.n / kN;
  const int64_t begin = rank * a.seg;
  const int64_t end = min(nv, begin + a.seg);
  if constexpr (kN > 1) {
    const int64_t row = first_block_row * a.rows_per_block + rib;
    if (blockIdx.x < a.prefetch_blocks && row < a.p.rows && lane == 0 && end > begin) {
      PrefetchL2(static_cast<const T*>(a.p.x) + row * a.p.n + begin * kN,
                 (end - begin) * kN * static_cast<int64_t>(sizeof(T)));
    }
  }
  PdlEnter();
  int buf = 0;
  for (int64_t block_row = first_block_row; block_row < row_blocks; block_row += stride, buf ^= 1) {
    SoftmaxRow<T, kN, kIters>(a, block_row * a.rows_per_block + rib, lane, begin, end, red[buf], &part[buf]);
  }
  if (c > 1) cg::this_cluster().sync();
}

int BucketFor(int64_t seg, int tpr, bool scalar) {
  const int b = ItersBucket(CeilDiv(seg, tpr));
  return (scalar && b != 0) ? 8 : b;
}

bool Fits(const SoftmaxConfig& c, int64_t rows, int64_t nv) {
  if (!IsPow2(c.threads_per_row) || c.threads_per_row > 1024) return false;
  if (!IsPow2(c.cluster) || c.cluster > kMaxClusterLarge) return false;
  if (c.rows_per_block < 1 || c.rows_per_block > 1024) return false;
  if (c.cluster > 1 && c.rows_per_block != 1) return false;
  const int64_t block = static_cast<int64_t>(c.threads_per_row) * c.rows_per_block;
  // Whole warps only: the reductions shuffle with a full lane mask.
  if (block > 1024 || block % 32 != 0) return false;
  return CeilDiv(rows, c.rows_per_block) * c.cluster <= 0x7fffffff;
}

// Smallest cluster whose segments fit the registers of 1024-thread blocks.
int MinCluster(int64_t nv, bool scalar) {
  for (int c = 1; c <= kMaxCluster; c *= 2) {
    if (BucketFor(CeilDiv(nv, c), 1024, scalar) != 0) return c;
  }
  return 0;  // streaming at any cluster size
}

SoftmaxConfig DefaultFor(int64_t rows, int64_t nv, bool scalar) {
  // Spread few rows over about two blocks per SM (132 SMs on an H100), but
  // give each block at least 256 vectors.
  int c = 1;
  while (c < kMaxCluster && rows * c * 2 <= 264 && CeilDiv(nv, c * 2) >= 256) c *= 2;
  const int min_c = MinCluster(nv, scalar);
  SoftmaxConfig out;
  if (min_c == 0) {
    out = {1024, 1, kMaxCluster};
  } else {
    c = std::max(c, min_c);
    const int64_t seg = CeilDiv(nv, c);
    out = {1024, 1, c};
    for (int target : {rows <= 64 ? 2 : 4, 8}) {
      const int64_t tpr = Pow2Ceil(CeilDiv(seg, target));
      if (tpr <= 1024 && BucketFor(seg, static_cast<int>(tpr), scalar) != 0) {
        out.threads_per_row = static_cast<int>(tpr);
        break;
      }
    }
  }
  if (out.cluster == 1 && out.threads_per_row < 128) {
    out.rows_per_block = 128 / out.threads_per_row;
    while (out.rows_per_block > 1 && out.rows_per_block / 2 >= rows && out.threads_per_row * out.rows_per_block > 32)
      out.rows_per_block /= 2;
  }
  return out;
}

int64_t VectorsPerRow(DType dtype, int64_t n, bool* scalar) {
  const int vec = static_cast<int>(16 / DTypeSize(dtype));
  *scalar = n % vec != 0;
  return *scalar ? n : n / vec;
}

// Clusters of `cluster` blocks of `block` threads this GPU holds at once
// (asked once per kernel, block and cluster size; sizes above 8 need the
// non-portable attribute). 0: not schedulable; -1: unknown (query failed).
template <typename T, int kN, int kIters>
int ActiveClusters(unsigned block, int cluster) {
  static std::atomic<int> cache[11][5];  // [log2 block][log2 cluster]: 0 unknown, else value + 2
  int lb = 0, lc = 0;
  while ((1u << lb) < block && lb < 10) ++lb;
  while ((1 << lc) < cluster && lc < 4) ++lc;
  int v = cache[lb][lc].load(std::memory_order_relaxed);
  if (v == 0) {
    auto kernel = SoftmaxKernel<T, kN, kIters>;
    int clusters = 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(cluster));
    cfg.blockDim = dim3(block);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim = {static_cast<unsigned>(cluster), 1, 1};
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    bool ok = true;
    if (cluster > kMaxCluster)
      ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    ok = ok && cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess;
    if (!ok) {
      cudaGetLastError();
      clusters = cluster > kMaxCluster ? 0 : -1;
    }
    v = clusters + 2;
    cache[lb][lc].store(v, std::memory_order_relaxed);
  }
  return v - 2;
}

// *unschedulable: a cluster size this GPU cannot run (nothing launched).
template <typename T, int kN, int kIters>
CudaStatus LaunchTyped(SoftmaxArgs a, cudaStream_t stream, bool* unschedulable) {
  const unsigned block = static_cast<unsigned>(a.tpr * a.rows_per_block);
  int64_t groups = CeilDiv(a.p.rows, a.rows_per_block);  // clusters (or blocks) in the grid
  if (a.cluster > 1) {
    const int active = ActiveClusters<T, kN, kIters>(block, a.cluster);
    if (active == 0) {
      *unschedulable = true;
      return CudaStatus::Ok();
    }
    if (active > 0) groups = std::min<int64_t>(groups, active);
  }
  const unsigned grid = static_cast<unsigned>(groups * a.cluster);
  a.prefetch_blocks = PrefetchBlocks(static_cast<int>(block));
  return LaunchKernel(SoftmaxKernel<T, kN, kIters>, dim3(grid), dim3(block), 0, stream, a.cluster, a);
}

template <typename T, int kN>
CudaStatus LaunchBucket(const SoftmaxArgs& a, int bucket, cudaStream_t stream, bool* unschedulable) {
  if constexpr (kN == 1) {
    return bucket == 0 ? LaunchTyped<T, kN, 0>(a, stream, unschedulable)
                       : LaunchTyped<T, kN, 8>(a, stream, unschedulable);
  } else {
    switch (bucket) {
      case 1:
        return LaunchTyped<T, kN, 1>(a, stream, unschedulable);
      case 2:
        return LaunchTyped<T, kN, 2>(a, stream, unschedulable);
      case 4:
        return LaunchTyped<T, kN, 4>(a, stream, unschedulable);
      case 8:
        return LaunchTyped<T, kN, 8>(a, stream, unschedulable);
      default:
        return LaunchTyped<T, kN, 0>(a, stream, unschedulable);
    }
  }
}

CudaStatus LaunchWith(const SoftmaxParams& p, const SoftmaxConfig& c, int64_t nv, bool scalar, cudaStream_t stream,
                      bool* unschedulable) {
  const int64_t seg = CeilDiv(nv, c.cluster);
  const SoftmaxArgs a{p, c.threads_per_row, c.rows_per_block, c.cluster, seg, 0};
  const int bucket = BucketFor(seg, c.threads_per_row, scalar);
  CudaStatus status = CudaStatus::Error("LaunchSoftmax: unsupported dtype");
  DispatchFloatType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = scalar ? LaunchBucket<T, 1>(a, bucket, stream, unschedulable)
                    : LaunchBucket<T, kVec16<T>>(a, bucket, stream, unschedulable);
  });
  return status;
}

}  // namespace

std::string FormatSoftmaxConfig(const SoftmaxConfig& c) {
  return "t" + std::to_string(c.threads_per_row) + ".r" + std::to_string(c.rows_per_block) + ".c" +
         std::to_string(c.cluster);
}

bool ParseSoftmaxConfig(const std::string& s, SoftmaxConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "trc", &v)) return false;
  *c = SoftmaxConfig{v[0], v[1], v[2]};
  return true;
}

SoftmaxConfig DefaultSoftmaxConfig(DType dtype, int64_t rows, int64_t n) {
  bool scalar = false;
  const int64_t nv = VectorsPerRow(dtype, std::max<int64_t>(n, 1), &scalar);
  return DefaultFor(rows, nv, scalar);
}

std::vector<SoftmaxConfig> SoftmaxCandidates(DType dtype, int64_t rows, int64_t n) {
  bool scalar = false;
  const int64_t nv = VectorsPerRow(dtype, std::max<int64_t>(n, 1), &scalar);
  std::vector<SoftmaxConfig> out = {DefaultFor(rows, nv, scalar)};
  auto add = [&](SoftmaxConfig c) {
    if (!Fits(c, rows, nv)) return;
    for (const SoftmaxConfig& o : out) {
      if (o.threads_per_row == c.threads_per_row && o.rows_per_block == c.rows_per_block && o.cluster == c.cluster)
        return;
    }
    out.push_back(c);
  };
  const int min_c = MinCluster(nv, scalar);
  if (min_c == 0) {
    for (int c : {8, 4, 1}) add({1024, 1, c});
    return out;
  }
  // Many rows: clusters only where a row needs them, and 4-8 vectors per
  // thread (more blocks per SM overlap one block's reduction with another's
  // loads: at N = 32000, 8 vectors x 512 threads ran at 100% of copy, 4 x
  // 1024 at 75%); few rows: every cluster size, for parallelism.
  const bool many = rows >= 1024;
  for (int c = min_c; c <= kMaxClusterLarge; c *= 2) {
    const int64_t seg = CeilDiv(nv, c);
    if (c > 1 && seg < 64) break;
    if (c > kMaxCluster && seg < 512) break;  // 16-block clusters: very long rows only
    if (many && c > 1 && c > 2 * min_c && seg < 512) break;
    for (int tpr = 1; tpr <= 1024; tpr *= 2) {
      if (tpr > Pow2Ceil(seg)) break;
      const int64_t iters = CeilDiv(seg, tpr);
      if (BucketFor(seg, tpr, scalar) == 0) continue;
      if (many && iters < 4 && tpr >= 32) continue;
      if (iters == 1 && rows > 64 && tpr >= 32) continue;  // 1 vector per thread: for latency only
      if (c == 1 && tpr < 128) {
        add({tpr, 128 / tpr, 1});
        add({tpr, 256 / tpr, 1});
      } else {
        add({tpr, 1, c});
      }
    }
  }
  return out;
}

CudaStatus LaunchSoftmax(const SoftmaxParams& p, const SoftmaxConfig& config, cudaStream_t stream) {
  if (p.rows <= 0 || p.n <= 0) return CudaStatus::Ok();
  if (p.x == nullptr || p.y == nullptr) return CudaStatus::Error("LaunchSoftmax: missing tensor");
  const int vec = static_cast<int>(16 / DTypeSize(p.dtype));
  const bool scalar = p.n % vec != 0 || !Aligned16(p.x) || !Aligned16(p.y);
  const int64_t nv = scalar ? p.n : p.n / vec;
  SoftmaxConfig c = config;
  if (!Fits(c, p.rows, nv)) c = DefaultFor(p.rows, nv, scalar);
  bool unschedulable = false;
  CudaStatus status = LaunchWith(p, c, nv, scalar, stream, &unschedulable);
  if (unschedulable) status = LaunchWith(p, DefaultFor(p.rows, nv, scalar), nv, scalar, stream, &unschedulable);
  return status;
}

}  // namespace fusedserve::cuda
