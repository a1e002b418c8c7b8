// Rotary position embedding (LLaMA rotate-half), q and k in one launch.
//
// RopeKernel<T, kN>: a block owns `tokens_per_block` tokens. It first issues
// the loads of its first kUnits (x[i..i+kN), x[i+D/2..i+D/2+kN)) vector pairs
// per thread, then, while they are in flight, fills a shared-memory table of
// (cos, sin) for its tokens' D/2 frequencies, shared by all Hq + Hkv heads.
// Angles are computed in fp64 (pos * theta^(-2i/D), reduced mod 2*pi) and
// only the reduced angle goes through sincosf: in fp32, pos * inv_freq alone
// is off by ~1e-3 rad at positions of a few thousand, a 1e-4 relative error
// in the output, above the fp32 tolerance. Bytes moved: q and k read once,
// q_out and k_out written once, positions (4 bytes per token).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope.h"

namespace fusedserve::cuda {
namespace {

constexpr int kUnits = 4;                  // vector pairs per thread per chunk
constexpr int kMaxTableBytes = 48 * 1024;  // the static shared-memory limit

struct RopeArgs {
  RopeParams p;
  int tokens_per_block;
  int half;             // D / 2
  int units_per_head;   // half / kN
  int units_per_token;  // (Hq + Hkv) * units_per_head
  double log2_theta;
};

template <typename T, int kN>
__global__ void __launch_bounds__(1024) RopeKernel(const RopeArgs a) {
  extern __shared__ float2 table[];  // [tokens_per_block, half] (cos, sin)
  const RopeParams& p = a.p;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * a.tokens_per_block;
  const int nt = static_cast<int>(min(static_cast<int64_t>(a.tokens_per_block), p.tokens - t0));
  const int half = a.half;
  const int units = nt * a.units_per_token;
  const int64_t D = p.head_dim;
  const int hq = static_cast<int>(p.heads_q);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  T* q_out = static_cast<T*>(p.q_out);
  T* k_out = static_cast<T*>(p.k_out);

  // Unit u of this block: token tok, head h (q heads first), vector c.
  // Returns the element offset of its first half in q (is_q) or k.
  auto locate = [&](int u, bool* is_q, int* tidx) -> int64_t {
    const int tok = u / a.units_per_token;
    const int r = u - tok * a.units_per_token;
    const int h = r / a.units_per_head;
    const int c = r - h * a.units_per_head;
    *tidx = tok * half + c * kN;
    *is_q = h < hq;
    const int64_t t = t0 + tok;
    return *is_q ? (t * hq + h) * D + c * kN : (t * p.heads_kv + (h - hq)) * D + c * kN;
  };

  Vec<T, kN> x1[kUnits], x2[kUnits];
  auto load_chunk = [&](int chunk) {
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int u = chunk + threadIdx.x + j * blockDim.x;
      if (u < units) {
        bool is_q;
        int tidx;
        const int64_t off = locate(u, &is_q, &tidx);
        const T* src = (is_q ? q : k) + off;
        x1[j].Load(src);
        x2[j].Load(src + half);
      }
    }
  };
  load_chunk(0);

  // cos/sin table while the loads are in flight.
  constexpr double kTwoPiHi = 6.283185307179586;
  constexpr double kTwoPiLo = 2.4492935982947064e-16;
  for (int i = threadIdx.x; i < nt * half; i += blockDim.x) {
    const int tok = i / half;
    const int f = i - tok * half;
    const double pos = static_cast<double>(p.positions[t0 + tok]);
    const double inv_freq = exp2(-2.0 * f / static_cast<double>(D) * a.log2_theta);
    const double angle = pos * inv_freq;
    const double turns = rint(angle * (1.0 / kTwoPiHi));
    const double r = fma(-turns, kTwoPiLo, fma(-turns, kTwoPiHi, angle));
    float s, c;
    sincosf(static_cast<float>(r), &s, &c);
    table[i] = make_float2(c, s);
  }
  __syncthreads();

  const int step = kUnits * blockDim.x;
  for (int chunk = 0; chunk < units; chunk += step) {
    if (chunk > 0) load_chunk(chunk);
#pragma unroll
    for (int j = 0; j < kUnits; ++j) {
      const int u = chunk + threadIdx.x + j * blockDim.x;
      if (u < units) {
        bool is_q;
        int tidx;
        const int64_t off = locate(u, &is_q, &tidx);
        float f1[kN], f2[kN];
        x1[j].ToFloats(f1);
        x2[j].ToFloats(f2);
        float o1[kN], o2[kN];
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          const float2 cs = table[tidx + i];
          o1[i] = f1[i] * cs.x - f2[i] * cs.y;
          o2[i] = f2[i] * cs.x + f1[i] * cs.y;
        }
        T* dst = (is_q ? q_out : k_out) + off;
        Vec<T, kN> v1, v2;
        v1.FromFloats(o1);
        v2.FromFloats(o2);
        v1.Store(dst);
        v2.Store(dst + half);
      }
    }
  }
}

int UnitsPerToken(int64_t heads, int64_t half, int vec) { return static_cast<int>(heads * (half / vec)); }

bool Fits(const RopeConfig& c, int64_t tokens, int64_t half, int64_t units_per_token) {
  if (c.threads < 32 || c.threads > 1024 || c.threads % 32 != 0) return false;
  if (c.tokens_per_block < 1 || c.tokens_per_block > 64) return false;
  if (static_cast<int64_t>(c.tokens_per_block) * half * 8 > kMaxTableBytes) return false;
  if (static_cast<int64_t>(c.tokens_per_block) * units_per_token > 0x7fffffff) return false;
  return CeilDiv(tokens, c.tokens_per_block) <= 0x7fffffff;
}

RopeConfig DefaultFor(int64_t tokens, int64_t half, int64_t upt) {
  // About two vector pairs per thread; several tokens per block when a token
  // has little work or there are many tokens.
  int r = 1;
  while (r < 8 && (upt * r < 256 || (tokens >= 4096 && r < 2)) && (r * 2) * half * 8 <= kMaxTableBytes &&
         tokens >= r * 2 * 132)
    r *= 2;
  RopeConfig c{static_cast<int>(std::clamp<int64_t>(Pow2Ceil(CeilDiv(upt * r, 2)), 32, 512)), r};
  if (!Fits(c, tokens, half, upt)) c = {256, 1};
  return c;
}

}  // namespace

std::string FormatRopeConfig(const RopeConfig& c) {
  return "t" + std::to_string(c.threads) + ".r" + std::to_string(c.tokens_per_block);
}

bool ParseRopeConfig(const std::string& s, RopeConfig* c) {
  std::vector<int> v;
  if (!ParseConfigInts(s, "tr", &v)) return false;
  *c = RopeConfig{v[0], v[1]};
  return true;
}

RopeConfig DefaultRopeConfig(DType dtype, int64_t tokens, int64_t heads_q, int64_t heads_kv, int64_t head_dim) {
  const int64_t half = std::max<int64_t>(head_dim / 2, 1);
  const int vec = half % (16 / DTypeSize(dtype)) == 0 ? static_cast<int>(16 / DTypeSize(dtype)) : 1;
  return DefaultFor(tokens, half, UnitsPerToken(heads_q + heads_kv, half, vec));
}

std::vector<RopeConfig> RopeCandidates(DType dtype, int64_t tokens, int64_t heads_q, int64_t heads_kv,
                                       int64_t head_dim) {
  const int64_t half = std::max<int64_t>(head_dim / 2, 1);
  const int vec = half % (16 / DTypeSize(dtype)) == 0 ? static_cast<int>(16 / DTypeSize(dtype)) : 1;
  const int64_t upt = UnitsPerToken(heads_q + heads_kv, half, vec);
  std::vector<RopeConfig> out = {DefaultFor(tokens, half, upt)};
  auto add = [&](RopeConfig c) {
    if (!Fits(c, tokens, half, upt)) return;
    for (const RopeConfig& o : out) {
      if (o.threads == c.threads && o.tokens_per_block == c.tokens_per_block) return;
    }
    out.push_back(c);
  };
  for (int r = 1; r <= 8; r *= 2) {
    if (r > 1 && tokens < r * 132) break;  // keep every SM busy
    for (int t = 64; t <= 1024; t *= 2) {
      const int64_t per_thread = CeilDiv(upt * r, t);
      if (per_thread > kUnits) continue;
      if (t > Pow2Ceil(upt * r)) break;
      add({t, r});
    }
  }
  return out;
}

CudaStatus LaunchRope(const RopeParams& p, const RopeConfig& config, cudaStream_t stream) {
  if (p.tokens <= 0 || p.head_dim <= 0 || p.heads_q + p.heads_kv <= 0) return CudaStatus::Ok();
  if (p.head_dim % 2 != 0) return CudaStatus::Error("LaunchRope: head_dim must be even");
  if (p.q == nullptr || p.k == nullptr || p.positions == nullptr || p.q_out == nullptr || p.k_out == nullptr)
    return CudaStatus::Error("LaunchRope: missing tensor");
  if (p.head_dim > 2 * (kMaxTableBytes / 8)) return CudaStatus::Error("LaunchRope: head_dim too large");
  const int64_t half = p.head_dim / 2;
  const int vec16 = static_cast<int>(16 / DTypeSize(p.dtype));
  const bool scalar = half % vec16 != 0 || !Aligned16(p.q) || !Aligned16(p.k) || !Aligned16(p.q_out) ||
                      !Aligned16(p.k_out);
  const int vec = scalar ? 1 : vec16;
  const int64_t upt = UnitsPerToken(p.heads_q + p.heads_kv, half, vec);
  RopeConfig c = config;
  if (!Fits(c, p.tokens, half, upt)) c = DefaultFor(p.tokens, half, upt);
  if (!Fits(c, p.tokens, half, upt)) return CudaStatus::Error("LaunchRope: too many heads for one block");
  RopeArgs a{p, c.tokens_per_block, static_cast<int>(half), static_cast<int>(half / vec), static_cast<int>(upt),
             std::log2(p.theta)};
  const unsigned grid = static_cast<unsigned>(CeilDiv(p.tokens, c.tokens_per_block));
  const size_t smem = static_cast<size_t>(c.tokens_per_block) * half * sizeof(float2);
  CudaStatus status = CudaStatus::Error("LaunchRope: unsupported dtype");
  DispatchFloatType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (scalar) {
      RopeKernel<T, 1><<<grid, c.threads, smem, stream>>>(a);
    } else {
      RopeKernel<T, kVec16<T>><<<grid, c.threads, smem, stream>>>(a);
    }
    status = FS_CUDA_CHECK_LAUNCH();
  });
  return status;
}

}  // namespace fusedserve::cuda
