// Rotary position embedding (LLaMA rotate-half), q and k in one launch.
//
// RopeKernel<T, kN, kU>: a flat grid over units (token, head, vector c): each
// thread issues the loads of its kU units (the vectors at c*kN and
// D/2 + c*kN of one q or k head, and the token's position) before any math,
// then rotates them. Each thread computes its own cos/sin, so there is no
// shared table and no barrier: the angle pos * theta^(-2i/D) is formed and
// reduced mod 2*pi in fp64 (inv_freq for the vector's first element comes
// precomputed from the host, the next ones by one fp64 multiply each), and
// only the reduced angle in [-pi, pi] goes through __sincosf (abs. error
// ~2^-21 there). In fp32 the product pos * inv_freq alone is off by ~1e-3
// rad at positions of a few thousand, a 1e-4 relative output error, above
// the fp32 tolerance. Bytes moved: q and k read once, q_out and k_out
// written once, 4 bytes of position per token (from L1/L2 after the first
// unit of a token).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace fusedserve::cuda {
namespace {

constexpr int kMaxBases = 64;  // inv_freq of vectors c < 64 passed as kernel parameters

// Two or more units per thread need more than the 64 registers a 1024-thread
// block leaves (-Xptxas -v: bf16, 2 units, spilled at 64).
constexpr int RopeMaxThreads(int unroll) { return unroll >= 2 ? 512 : 1024; }

struct RopeArgs {
  RopeParams p;
  int64_t total;        // units: tokens * units_per_token
  int units_per_token;  // (Hq + Hkv) * units_per_head
  int units_per_head;   // (D / 2) / kN
  int half;             // D / 2
  bool wide;            // total >= 2^31: 64-bit division
  FastDiv div_token;    // / units_per_token
  FastDiv div_head;     // / units_per_head
  double ratio;         // theta^(-2/D): inv_freq[i + 1] = inv_freq[i] * ratio
  double log2_theta;
  double base[kMaxBases];   // inv_freq[c * kN] = theta^(-2 c kN / D)
  int64_t prefetch_blocks;  // blocks [0, prefetch_blocks) prefetch their tokens' q and k (vector path)
};

template <typename T, int kN, int kU>
__global__ void __launch_bounds__(RopeMaxThreads(kU)) RopeKernel(const RopeArgs a) {
  const RopeParams& p = a.p;
  const int64_t block_first = static_cast<int64_t>(blockIdx.x) * blockDim.x * kU;
  const int64_t first = block_first + threadIdx.x;
  const int hq = static_cast<int>(p.heads_q);
  const int64_t D = p.head_dim;
  if constexpr (kN > 1) {
    if (blockIdx.x < a.prefetch_blocks && threadIdx.x == 0) {
      // q and k rows of the tokens this block touches.
      const int64_t last = min(a.total, block_first + static_cast<int64_t>(blockDim.x) * kU) - 1;
      const int64_t t0 = block_first / a.units_per_token, t1 = last / a.units_per_token;
      PrefetchL2(static_cast<const T*>(p.q) + t0 * hq * D, (t1 - t0 + 1) * hq * D * static_cast<int64_t>(sizeof(T)));
      PrefetchL2(static_cast<const T*>(p.k) + t0 * p.heads_kv * D,
                 (t1 - t0 + 1) * p.heads_kv * D * static_cast<int64_t>(sizeof(T)));
    }
  }
  PdlEnter();
  Vec<T, kN> x1[kU], x2[kU];
  int64_t off[kU];
  int c[kU], pos[kU];
  bool is_q[kU];
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t u = first + static_cast<int64_t>(k) * blockDim.x;
    if (u < a.total) {
      const int64_t tok = a.wide ? u / a.units_per_token : a.div_token.Div(static_cast<uint32_t>(u));
      const int rem = static_cast<int>(u - tok * a.units_per_token);
      const int h = static_cast<int>(a.div_head.Div(static_cast<uint32_t>(rem)));
      c[k] = rem - h * a.units_per_head;
      is_q[k] = h < hq;
      off[k] = (is_q[k] ? tok * hq + h : tok * p.heads_kv + (h - hq)) * D + c[k] * kN;
      const T* src = (is_q[k] ? static_cast<const T*>(p.q) : static_cast<const T*>(p.k)) + off[k];
      x1[k].Load(src);
      x2[k].Load(src + a.half);
      pos[k] = p.positions[tok];
    }
  }
  constexpr double kTwoPiHi = 6.283185307179586;
  constexpr double kTwoPiLo = 2.4492935982947064e-16;
  constexpr double kInvTwoPi = 0.15915494309189535;
  constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52: (x + kRound) - kRound = rint(x), |x| < 2^51
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int64_t u = first + static_cast<int64_t>(k) * blockDim.x;
    if (u < a.total) {
      double inv_freq =
          c[k] < kMaxBases ? a.base[c[k]] : exp2(-2.0 * static_cast<double>(c[k]) * kN / D * a.log2_theta);
      const double pd = static_cast<double>(pos[k]);
      float f1[kN], f2[kN], o1[kN], o2[kN];
      x1[k].ToFloats(f1);
      x2[k].ToFloats(f2);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        const double angle = pd * inv_freq;
        const double turns = (angle * kInvTwoPi + kRound) - kRound;
        const double r = fma(-turns, kTwoPiLo, fma(-turns, kTwoPiHi, angle));
        float sn, cs;
        __sincosf(static_cast<float>(r), &sn, &cs);
        o1[i] = f1[i] * cs - f2[i] * sn;
        o2[i] = f2[i] * cs + f1[i] * sn;
        inv_freq *= a.ratio;
      }
      T* dst = (is_q[k] ? static_cast<T*>(p.q_out) : static_cast<T*>(p.k_out)) + off[k];
      Vec<T, kN> v1, v2;
      v1.FromFloats(o1);
      v2.FromFloats(o2);
      v1.Store(dst);
      v2.Store(dst + a.half);
    }
  }
}

bool Fits(const RopeConfig& c, int64_t total) {
  if (c.threads < 32 || c.threads > 1024 || c.threads % 32 != 0) return false;
  if (c.unroll != 1 && c.unroll != 2 && c.unroll != 4) return false;
  if (c.threads > RopeMaxThreads(c.unroll)) return false;
  return CeilDiv(total, static_cast<int64_t>(c.threads) * c.unroll) <= 0x7fffffff;
}

RopeConfig DefaultFor(int64_t total) {
  // Enough units to give every SM of an H100 (132) 2048 threads: two per
  // thread; fewer: one per thread, small blocks for more SMs.
  if (total >= 2 * 132 * 2048) return {256, 2};
  if (total >= 132 * 256) return {256, 1};
  return {128, 1};
}

int VecFor(DType dtype, int64_t half) {
  const int vec = static_cast<int>(16 / DTypeSize(dtype));
  return half % vec == 0 ? vec : 1;
}

int64_t TotalUnits(DType dtype, int64_t tokens, int64_t heads_q, int64_t heads_kv, int64_t head_dim) {
  const int64_t half = std::max<int64_t>(head_dim / 2, 1);
  return tokens * (heads_q + heads_kv) * (half / VecFor(dtype, half));
}

template <typename T, int kN>
CudaStatus LaunchTyped(RopeArgs a, const RopeConfig& c, cudaStream_t stream) {
  a.prefetch_blocks = PrefetchBlocks(c.threads);
  const dim3 grid(static_cast<unsigned>(CeilDiv(a.total, static_cast<int64_t>(c.threads) * c.unroll)));
  const dim3 block(static_cast<unsigned>(c.threads));
  switch (c.unroll) {
    case 1:
      return LaunchKernel(RopeKernel<T, kN, 1>, grid, block, 0, stream, 1, a);
    case 2:
      return LaunchKernel(RopeKernel<T, kN, 2>, grid, block, 0, stream, 1, a);
    default:
      return LaunchKernel(RopeKernel<T, kN, 4>, grid, block, 0, stream, 1, a);
  }
}

}  // namespace

std::string FormatRopeConfig(const RopeConfig& c) {
  return "t" + std::to_string(c.threads) + ".u" + std::to_string(c.unroll);
}

bool ParseRopeConfig(const std::string& s, RopeConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "tu", &v)) return false;
  *c = RopeConfig{v[0], v[1]};
  return true;
}

RopeConfig DefaultRopeConfig(DType dtype, int64_t tokens, int64_t heads_q, int64_t heads_kv, int64_t head_dim) {
  return DefaultFor(TotalUnits(dtype, tokens, heads_q, heads_kv, head_dim));
}

std::vector<RopeConfig> RopeCandidates(DType dtype, int64_t tokens, int64_t heads_q, int64_t heads_kv,
                                       int64_t head_dim) {
  const int64_t total = TotalUnits(dtype, tokens, heads_q, heads_kv, head_dim);
  return ThreadUnrollCandidates(DefaultFor(total), total, [&](const RopeConfig& c) { return Fits(c, total); });
}

CudaStatus LaunchRope(const RopeParams& p, const RopeConfig& config, cudaStream_t stream) {
  if (p.tokens <= 0 || p.head_dim <= 0 || p.heads_q + p.heads_kv <= 0) return CudaStatus::Ok();
  if (p.head_dim % 2 != 0) return CudaStatus::Error("LaunchRope: head_dim must be even");
  if (p.q == nullptr || p.k == nullptr || p.positions == nullptr || p.q_out == nullptr || p.k_out == nullptr)
    return CudaStatus::Error("LaunchRope: missing tensor");
  if ((p.heads_q + p.heads_kv) * p.head_dim > 0x7fffffff) return CudaStatus::Error("LaunchRope: token too large");
  const int64_t half = p.head_dim / 2;
  const bool scalar =
      VecFor(p.dtype, half) == 1 || !Aligned16(p.q) || !Aligned16(p.k) || !Aligned16(p.q_out) || !Aligned16(p.k_out);
  const int vec = scalar ? 1 : VecFor(p.dtype, half);
  RopeArgs a{};
  a.p = p;
  a.units_per_head = static_cast<int>(half / vec);
  a.units_per_token = static_cast<int>((p.heads_q + p.heads_kv) * a.units_per_head);
  a.total = p.tokens * a.units_per_token;
  a.half = static_cast<int>(half);
  a.wide = a.total >= (int64_t{1} << 31);
  a.div_token = FastDiv(a.units_per_token);
  a.div_head = FastDiv(a.units_per_head);
  a.log2_theta = std::log2(p.theta);
  a.ratio = std::pow(p.theta, -2.0 / static_cast<double>(p.head_dim));
  for (int c = 0; c < kMaxBases; ++c) {
    a.base[c] = std::pow(p.theta, -2.0 * static_cast<double>(c) * vec / static_cast<double>(p.head_dim));
  }
  RopeConfig c = config;
  if (!Fits(c, a.total)) c = DefaultFor(a.total);
  CudaStatus status = CudaStatus::Error("LaunchRope: unsupported dtype");
  DispatchFloatType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    status = scalar ? LaunchTyped<T, 1>(a, c, stream) : LaunchTyped<T, kVec16<T>>(a, c, stream);
  });
  return status;
}

}  // namespace fusedserve::cuda
