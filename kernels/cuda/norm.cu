// Row normalisations (rms_norm, add_rms_norm, add_rms_norm_silu, layer_norm).
//
// One kernel template, NormKernel<T, kN, kKind, kIters>:
//   - kN: 16-byte vectors (kVec16<T> elements) or the scalar path (1);
//   - kIters > 0: each of a row's `tpr` threads holds up to kIters vectors of
//     the row in registers, so x (and the residual) are read from HBM once and
//     the statistics and the output come from registers;
//   - kIters == 0: rows too long for registers stream through twice (the
//     second read mostly hits L2).
// One block reduction per row: layer_norm reduces (sum, sum of squares) of
// x minus the row's first element in one pass (a shift within a few standard
// deviations of the mean keeps E[d^2] - E[d]^2 from cancelling); the earlier
// mean-then-centred-squares version (two reductions) and a Chan-combining
// one (a division per step) cost 0.6-1 us more at M = 1 on the H100.
// Several short rows share a block (rows_per_block), rows of <= 32 threads
// reduce with shuffles only. Bytes moved: x (+ residual) read once, y (+
// residual_out) written once, weight/bias from L1/L2.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm.h"

namespace fusedserve::cuda {
namespace {

constexpr int kMaxIters = 8;

// Register-resident vectors per thread, rounded up to an instantiated size
// (0: too many, stream instead).
constexpr int ItersBucket(int64_t iters) {
  return iters <= 1 ? 1 : iters <= 2 ? 2 : iters <= 4 ? 4 : iters <= kMaxIters ? 8 : 0;
}
// Block-size cap per bucket: 8 vectors (x and residual: 64 registers) need
// more than the 64 registers a 1024-thread block leaves each thread.
constexpr int NormMaxThreads(int bucket) { return bucket == 8 ? 512 : 1024; }

struct NormArgs {
  NormParams p;
  int tpr;  // threads per row
  int rows_per_block;
  int64_t prefetch_blocks;  // blocks [0, prefetch_blocks) prefetch their rows (vector path)
};

// y[j] = (f - mean) * rstd * w[j] (+ b[j]) (then silu) for vector j, with
// w[j] and b[j] already loaded.
template <typename T, int kN, NormKind kKind>
__device__ __forceinline__ void StoreNormalized(const float (&f)[kN], float mean, float rstd, const Vec<T, kN>& wv,
                                                const Vec<T, kN>& bv, int j, T* y) {
  float wf[kN];
  wv.ToFloats(wf);
  float bf[kN] = {};
  if constexpr (kKind == NormKind::kLayer) bv.ToFloats(bf);
  float o[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    o[i] = (f[i] - mean) * rstd * wf[i] + bf[i];
    if constexpr (kKind == NormKind::kAddRmsSilu) o[i] = __fdividef(o[i], 1.0f + __expf(-o[i]));
  }
  Vec<T, kN> ov;
  ov.FromFloats(o);
  ov.Store(y + j * kN);
}

template <typename T, int kN, NormKind kKind>
__device__ __forceinline__ void LoadParams(const T* w, const T* b, int j, Vec<T, kN>& wv, Vec<T, kN>& bv) {
  wv.Load(w + j * kN);
  if constexpr (kKind == NormKind::kLayer) bv.Load(b + j * kN);
}

template <typename T, int kN, NormKind kKind, int kIters>
__global__ void __launch_bounds__(NormMaxThreads(kIters)) NormKernel(const NormArgs a) {
  constexpr bool kAdd = kKind == NormKind::kAddRms || kKind == NormKind::kAddRmsSilu;
  constexpr bool kLayer = kKind == NormKind::kLayer;
  // Weight (and bias) loaded with x when the registers allow: at M = 1 that
  // takes a dependent L2 round trip off the critical path.
  constexpr int kArrays = 2 + (kAdd ? 1 : 0) + (kLayer ? 1 : 0);
  constexpr bool kPrefetch = kIters > 0 && kIters * kArrays <= 8;
  __shared__ float red[32];
  __shared__ float2 red2[32];
  const NormParams& p = a.p;
  const int tpr = a.tpr;
  const int rib = threadIdx.x / tpr;
  const int lane = threadIdx.x - rib * tpr;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * a.rows_per_block + rib;
  const bool active = row < p.rows;
  const int64_t H = p.hidden;
  const int nv = static_cast<int>(H / kN);
  const int64_t off = active ? row * H : 0;
  const T* x = static_cast<const T*>(p.x) + off;                            // [H]
  const T* res = kAdd ? static_cast<const T*>(p.residual) + off : nullptr;  // [H]
  T* y = static_cast<T*>(p.y) + off;                                        // [H]
  T* res_out = kKind == NormKind::kAddRms ? static_cast<T*>(p.residual_out) + off : nullptr;
  const T* w = static_cast<const T*>(p.weight);                   // [H]
  const T* b = kLayer ? static_cast<const T*>(p.bias) : nullptr;  // [H]
  const float inv_h = 1.0f / static_cast<float>(H);
  if constexpr (kN > 1) {
    if (blockIdx.x < a.prefetch_blocks) {
      if (active && lane == 0) {
        PrefetchL2(x, H * sizeof(T));
        if constexpr (kAdd) PrefetchL2(res, H * sizeof(T));
      }
      if (threadIdx.x == 0) {
        PrefetchL2(w, H * sizeof(T));
        if constexpr (kLayer) PrefetchL2(b, H * sizeof(T));
      }
    }
  }
  PdlEnter();

  // x (+ residual) of vector j as fp32. The sum is rounded to T first: it is
  // the residual_out the caller gets, and y is the norm of that tensor.
  auto combine = [&](Vec<T, kN>& v, const Vec<T, kN>& r, int j, bool store_residual, float(&f)[kN]) {
    if constexpr (kAdd) {
      float g[kN];
      v.ToFloats(f);
      r.ToFloats(g);
#pragma unroll
      for (int i = 0; i < kN; ++i) f[i] += g[i];
      v.FromFloats(f);
      if constexpr (kKind == NormKind::kAddRms) {
        if (store_residual) v.Store(res_out + j * kN);
      }
    }
    v.ToFloats(f);
  };
  // layer_norm statistics: sums of x - shift, shift = the row's first
  // element (within a few standard deviations of the mean, so E[d^2] - E[d]^2
  // does not cancel), reduced in one pass over the row's threads.
  // rms_norm: the sum of squares.
  float shift = 0.0f;
  float acc = 0.0f, acc2 = 0.0f;
  auto accumulate = [&](const float(&f)[kN]) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      if constexpr (kLayer) {
        const float d = f[i] - shift;
        acc += d;
        acc2 += d * d;
      } else {
        acc += f[i] * f[i];
      }
    }
  };
  auto finish = [&](float* mean, float* rstd) {
    if constexpr (kLayer) {
      const float2 t = RowReduce(make_float2(acc, acc2), Sum2Op(), tpr, red2);
      const float md = t.x * inv_h;
      *mean = shift + md;
      *rstd = rsqrtf(fmaxf(t.y * inv_h - md * md, 0.0f) + p.eps);
    } else {
      *mean = 0.0f;
      *rstd = rsqrtf(RowReduce(acc, SumOp(), tpr, red) * inv_h + p.eps);
    }
  };

  if constexpr (kIters > 0) {
    // Register path: issue every load of the row first.
    Vec<T, kN> v[kIters];
    Vec<T, kN> r[kAdd ? kIters : 1];
    Vec<T, kN> wv[kPrefetch ? kIters : 1];
    Vec<T, kN> bv[kPrefetch && kLayer ? kIters : 1];
    if constexpr (kLayer) {
      if (active) shift = ToFloat(x[0]);
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int j = lane + it * tpr;
      if (active && j < nv) {
        v[it].Load(x + j * kN);
        if constexpr (kAdd) r[it].Load(res + j * kN);
        if constexpr (kPrefetch) LoadParams<T, kN, kKind>(w, b, j, wv[it], bv[kLayer ? it : 0]);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int j = lane + it * tpr;
      if (active && j < nv) {
        float f[kN];
        combine(v[it], r[kAdd ? it : 0], j, true, f);
        accumulate(f);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) v[it].Launder();
    float mean, rstd;
    finish(&mean, &rstd);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int j = lane + it * tpr;
      if (active && j < nv) {
        float f[kN];
        v[it].ToFloats(f);
        if constexpr (kPrefetch) {
          StoreNormalized<T, kN, kKind>(f, mean, rstd, wv[it], bv[kLayer ? it : 0], j, y);
        } else {
          Vec<T, kN> wl, bl;
          LoadParams<T, kN, kKind>(w, b, j, wl, bl);
          StoreNormalized<T, kN, kKind>(f, mean, rstd, wl, bl, j, y);
        }
      }
    }
  } else {
    // Streaming path for rows longer than the registers hold: statistics in a
    // first pass, normalisation in a second (mostly from L2).
    if constexpr (kLayer) {
      if (active) shift = ToFloat(x[0]);
    }
    if (active) {
      for (int j = lane; j < nv; j += tpr) {
        Vec<T, kN> v, r;
        v.Load(x + j * kN);
        if constexpr (kAdd) r.Load(res + j * kN);
        float f[kN];
        combine(v, r, j, true, f);
        accumulate(f);
      }
    }
    float mean, rstd;
    finish(&mean, &rstd);
    if (active) {
      for (int j = lane; j < nv; j += tpr) {
        Vec<T, kN> v, r;
        v.Load(x + j * kN);
        if constexpr (kAdd) r.Load(res + j * kN);
        float f[kN];
        combine(v, r, j, false, f);
        Vec<T, kN> wl, bl;
        LoadParams<T, kN, kKind>(w, b, j, wl, bl);
        StoreNormalized<T, kN, kKind>(f, mean, rstd, wl, bl, j, y);
      }
    }
  }
}

// The instantiated variant for vector count nv and a block of `block`
// threads: 1/2/4/8 register-resident vectors, or 0 (streaming) when the row
// does not fit (the scalar path only has the 8-vector and streaming variants).
int BucketFor(int64_t nv, int tpr, int64_t block, bool scalar) {
  int b = ItersBucket(CeilDiv(nv, tpr));
  if (scalar && b != 0) b = 8;
  if (b != 0 && block > NormMaxThreads(b)) b = 0;
  return b;
}

int BucketFor(int64_t nv, const NormConfig& c, bool scalar) {
  return BucketFor(nv, c.threads_per_row, static_cast<int64_t>(c.threads_per_row) * c.rows_per_block, scalar);
}

bool Fits(const NormConfig& c, int64_t rows) {
  if (!IsPow2(c.threads_per_row) || c.threads_per_row > 1024) return false;
  if (c.rows_per_block < 1 || c.rows_per_block > 1024) return false;
  const int64_t block = static_cast<int64_t>(c.threads_per_row) * c.rows_per_block;
  // Whole warps only: the reductions shuffle with a full lane mask.
  if (block > 1024 || block % 32 != 0) return false;
  return CeilDiv(rows, c.rows_per_block) <= 0x7fffffff;
}

NormConfig DefaultFor(int64_t rows, int64_t nv, bool scalar) {
  NormConfig c;
  c.threads_per_row = 0;
  // Few rows: one vector per thread (shortest latency); many rows: two.
  for (int target : {rows <= 64 ? 1 : 2, 4, 8}) {
    const int64_t tpr = Pow2Ceil(CeilDiv(nv, target));
    if (tpr > 1024) continue;
    const NormConfig t{static_cast<int>(tpr), 1};
    if (BucketFor(nv, t, scalar) != 0) {
      c = t;
      break;
    }
  }
  if (c.threads_per_row == 0) c = {1024, 1};  // streaming
  // Short rows: pack rows so that a block has at least 128 threads.
  if (c.threads_per_row < 128) c.rows_per_block = 128 / c.threads_per_row;
  while (c.rows_per_block > 1 && c.rows_per_block / 2 >= rows && c.threads_per_row * c.rows_per_block > 32)
    c.rows_per_block /= 2;
  return c;
}

int64_t VectorsPerRow(DType dtype, int64_t hidden, bool* scalar) {
  const int vec = static_cast<int>(16 / DTypeSize(dtype));
  *scalar = hidden % vec != 0;
  return *scalar ? hidden : hidden / vec;
}

template <typename T, int kN, NormKind kKind, int kIters>
CudaStatus LaunchTyped(const NormArgs& a, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(CeilDiv(a.p.rows, a.rows_per_block));
  const unsigned block = static_cast<unsigned>(a.tpr * a.rows_per_block);
  return LaunchKernel(NormKernel<T, kN, kKind, kIters>, dim3(grid), dim3(block), 0, stream, 1, a);
}

template <typename T, int kN, NormKind kKind>
CudaStatus LaunchBucket(const NormArgs& a, int bucket, cudaStream_t stream) {
  if constexpr (kN == 1) {
    return bucket == 0 ? LaunchTyped<T, kN, kKind, 0>(a, stream) : LaunchTyped<T, kN, kKind, 8>(a, stream);
  } else {
    switch (bucket) {
      case 1:
        return LaunchTyped<T, kN, kKind, 1>(a, stream);
      case 2:
        return LaunchTyped<T, kN, kKind, 2>(a, stream);
      case 4:
        return LaunchTyped<T, kN, kKind, 4>(a, stream);
      case 8:
        return LaunchTyped<T, kN, kKind, 8>(a, stream);
      default:
        return LaunchTyped<T, kN, kKind, 0>(a, stream);
    }
  }
}

template <typename T, int kN>
CudaStatus LaunchKind(const NormArgs& a, int bucket, cudaStream_t stream) {
  switch (a.p.kind) {
    case NormKind::kRms:
      return LaunchBucket<T, kN, NormKind::kRms>(a, bucket, stream);
    case NormKind::kAddRms:
      return LaunchBucket<T, kN, NormKind::kAddRms>(a, bucket, stream);
    case NormKind::kAddRmsSilu:
      return LaunchBucket<T, kN, NormKind::kAddRmsSilu>(a, bucket, stream);
    case NormKind::kLayer:
      return LaunchBucket<T, kN, NormKind::kLayer>(a, bucket, stream);
  }
  return CudaStatus::Error("LaunchNorm: unknown kind");
}

}  // namespace

std::string FormatNormConfig(const NormConfig& c) {
  return "t" + std::to_string(c.threads_per_row) + ".r" + std::to_string(c.rows_per_block);
}

bool ParseNormConfig(const std::string& s, NormConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "tr", &v)) return false;
  *c = NormConfig{v[0], v[1]};
  return true;
}

NormConfig DefaultNormConfig(DType dtype, int64_t rows, int64_t hidden) {
  bool scalar = false;
  const int64_t nv = VectorsPerRow(dtype, std::max<int64_t>(hidden, 1), &scalar);
  return DefaultFor(rows, nv, scalar);
}

std::vector<NormConfig> NormCandidates(DType dtype, int64_t rows, int64_t hidden) {
  bool scalar = false;
  const int64_t nv = VectorsPerRow(dtype, std::max<int64_t>(hidden, 1), &scalar);
  std::vector<NormConfig> out = {DefaultFor(rows, nv, scalar)};
  auto add = [&](NormConfig c, bool streaming) {
    if (!Fits(c, rows) || (BucketFor(nv, c, scalar) == 0) != streaming) return;
    for (const NormConfig& o : out) {
      if (o.threads_per_row == c.threads_per_row && o.rows_per_block == c.rows_per_block) return;
    }
    out.push_back(c);
  };
  for (int tpr = 1; tpr <= 1024 && tpr <= Pow2Ceil(nv); tpr *= 2) {
    if (tpr >= 256) {
      add({tpr, 1}, false);
    } else if (tpr >= 32) {
      add({tpr, std::max(1, 128 / tpr)}, false);
      add({tpr, 256 / tpr}, false);
      if (tpr == 128) add({tpr, 1}, false);
    } else {
      add({tpr, 128 / tpr}, false);
      add({tpr, 256 / tpr}, false);
    }
  }
  if (out.size() == 1 && BucketFor(nv, out[0], scalar) == 0) {
    // Nothing fits in registers: streaming shapes.
    for (int tpr : {1024, 512, 256}) add({tpr, 1}, true);
  }
  return out;
}

CudaStatus LaunchNorm(const NormParams& p, const NormConfig& config, cudaStream_t stream) {
  if (p.rows <= 0 || p.hidden <= 0) return CudaStatus::Ok();
  if (p.hidden > 0x7fffffff) return CudaStatus::Error("LaunchNorm: hidden size too large");
  const bool add = p.kind == NormKind::kAddRms || p.kind == NormKind::kAddRmsSilu;
  if (p.x == nullptr || p.weight == nullptr || p.y == nullptr || (add && p.residual == nullptr) ||
      (p.kind == NormKind::kAddRms && p.residual_out == nullptr) || (p.kind == NormKind::kLayer && p.bias == nullptr)) {
    return CudaStatus::Error("LaunchNorm: missing tensor");
  }
  const int vec = static_cast<int>(16 / DTypeSize(p.dtype));
  bool scalar = p.hidden % vec != 0;
  for (const void* ptr :
       {p.x, p.residual, p.weight, p.bias, static_cast<const void*>(p.y), static_cast<const void*>(p.residual_out)}) {
    if (ptr != nullptr && !Aligned16(ptr)) scalar = true;
  }
  const int64_t nv = scalar ? p.hidden : p.hidden / vec;
  NormConfig c = config;
  if (!Fits(c, p.rows)) c = DefaultFor(p.rows, nv, scalar);
  NormArgs a{p, c.threads_per_row, c.rows_per_block, PrefetchBlocks(c.threads_per_row * c.rows_per_block)};
  const int bucket = BucketFor(nv, c, scalar);
  CudaStatus status = CudaStatus::Error("LaunchNorm: unsupported dtype");
  DispatchFloatType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = scalar ? LaunchKind<T, 1>(a, bucket, stream) : LaunchKind<T, kVec16<T>>(a, bucket, stream);
  });
  return status;
}

}  // namespace fusedserve::cuda
