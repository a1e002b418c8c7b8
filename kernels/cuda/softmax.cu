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

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax.h"

namespace cg = cooperative_groups;

namespace fusedserve::cuda {
namespace {

constexpr int kMaxIters = 8;
constexpr int kMaxCluster = 8;  // the portable cluster size limit

constexpr int ItersBucket(int64_t iters) {
  return iters <= 1 ? 1 : iters <= 2 ? 2 : iters <= 4 ? 4 : iters <= kMaxIters ? 8 : 0;
}

struct SoftmaxArgs {
  SoftmaxParams p;
  int tpr;
  int rows_per_block;
  int cluster;
  int64_t seg;  // vectors per cluster rank
};

// Combines the (max, sum) of the `c` blocks of this cluster. Every thread of
// the block calls it with its block's result; every thread gets the row's.
// The caller must call cg::this_cluster().barrier_wait() before exiting (the
// peers may still read this block's `part`).
__device__ __forceinline__ MaxSum ClusterCombine(MaxSum t, int c, MaxSum* part) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *part = t;
  cluster.sync();
  const int lane = threadIdx.x & 31;
  MaxSum q = MaxSumOp::Identity();
  if (lane < c) q = *cluster.map_shared_rank(part, lane);
  q = GroupReduce(q, MaxSumOp(), 32);
  cluster.barrier_arrive();
  return q;
}

template <typename T, int kN, int kIters>
__global__ void __launch_bounds__(1024) SoftmaxKernel(const SoftmaxArgs a) {
  __shared__ MaxSum red2[32];
  __shared__ MaxSum part;
  PdlEnter();
  const SoftmaxParams& p = a.p;
  const int c = a.cluster;
  const int tpr = a.tpr;
  // A 1-D grid of 1-D clusters: consecutive blocks form a cluster.
  const int rank = c > 1 ? static_cast<int>(blockIdx.x % c) : 0;
  const int64_t block_row = c > 1 ? blockIdx.x / c : blockIdx.x;
  const int rib = threadIdx.x / tpr;
  const int lane = threadIdx.x - rib * tpr;
  const int64_t row = block_row * a.rows_per_block + rib;
  const bool active = row < p.rows;
  const int64_t nv = p.n / kN;
  const int64_t begin = rank * a.seg;
  const int64_t end = min(nv, begin + a.seg);
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
    MaxSum t = RowReduce(MaxSum{m, s}, MaxSumOp(), tpr, red2);
    if (c > 1) t = ClusterCombine(t, c, &part);
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
    t = RowReduce(t, MaxSumOp(), tpr, red2);
    if (c > 1) t = ClusterCombine(t, c, &part);
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
  if (c > 1) cg::this_cluster().barrier_wait();
}

int BucketFor(int64_t seg, int tpr, bool scalar) {
  const int b = ItersBucket(CeilDiv(seg, tpr));
  return (scalar && b != 0) ? 8 : b;
}

bool Fits(const SoftmaxConfig& c, int64_t rows, int64_t nv) {
  if (!IsPow2(c.threads_per_row) || c.threads_per_row > 1024) return false;
  if (!IsPow2(c.cluster) || c.cluster > kMaxCluster) return false;
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
    while (out.rows_per_block > 1 && out.rows_per_block / 2 >= rows &&
           out.threads_per_row * out.rows_per_block > 32)
      out.rows_per_block /= 2;
  }
  return out;
}

int64_t VectorsPerRow(DType dtype, int64_t n, bool* scalar) {
  const int vec = static_cast<int>(16 / DTypeSize(dtype));
  *scalar = n % vec != 0;
  return *scalar ? n : n / vec;
}

template <typename T, int kN, int kIters>
CudaStatus LaunchTyped(const SoftmaxArgs& a, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(CeilDiv(a.p.rows, a.rows_per_block) * a.cluster);
  const unsigned block = static_cast<unsigned>(a.tpr * a.rows_per_block);
  return LaunchKernel(SoftmaxKernel<T, kN, kIters>, dim3(grid), dim3(block), 0, stream, a.cluster, a);
}

template <typename T, int kN>
CudaStatus LaunchBucket(const SoftmaxArgs& a, int bucket, cudaStream_t stream) {
  if constexpr (kN == 1) {
    return bucket == 0 ? LaunchTyped<T, kN, 0>(a, stream) : LaunchTyped<T, kN, 8>(a, stream);
  } else {
    switch (bucket) {
      case 1: return LaunchTyped<T, kN, 1>(a, stream);
      case 2: return LaunchTyped<T, kN, 2>(a, stream);
      case 4: return LaunchTyped<T, kN, 4>(a, stream);
      case 8: return LaunchTyped<T, kN, 8>(a, stream);
      default: return LaunchTyped<T, kN, 0>(a, stream);
    }
  }
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
  for (int c = min_c; c <= kMaxCluster; c *= 2) {
    const int64_t seg = CeilDiv(nv, c);
    if (c > 1 && seg < 64) break;
    if (many && c > 1 && c > 2 * min_c && seg < 1024) break;
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
  const int64_t seg = CeilDiv(nv, c.cluster);
  SoftmaxArgs a{p, c.threads_per_row, c.rows_per_block, c.cluster, seg};
  const int bucket = BucketFor(seg, c.threads_per_row, scalar);
  CudaStatus status = CudaStatus::Error("LaunchSoftmax: unsupported dtype");
  DispatchFloatType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = scalar ? LaunchBucket<T, 1>(a, bucket, stream) : LaunchBucket<T, kVec16<T>>(a, bucket, stream);
  });
  return status;
}

}  // namespace fusedserve::cuda
