// The decode fusions of the GEMV (kernels/cuda/gemv.h: LaunchGemvFused,
// LaunchGemvSwigluFused) against host references in double: the RMS norm
// folded into the GEMV, the residual epilogue, the SwiGLU gate on the normed
// x, and the QKV epilogue with rope and the paged KV-cache write (and the
// norm epilogues on the skinny GEMMs, skinny_gemm.h: the narrow kernel up to
// 32 rows, the Hopper kernel of skinny_hopper.h above on a compute
// capability 9.0 device). bf16 and fp16, one row and several (the kernel's M
// tiles 1, 2, 4, 8), fresh random inputs per case, outputs poisoned (NaN)
// before each launch. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/env_knob.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/skinny_hopper.h"
#include "kernels/dtype.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Host values rounded to the dtype (the device sees exactly these).
struct Host {
  DType dt;
  std::vector<uint16_t> bits;
  std::vector<float> f;
  Host(DType d, size_t n, std::mt19937& rng, float scale) : dt(d), bits(n), f(n) {
    std::normal_distribution<float> nd(0.0f, scale);
    for (size_t i = 0; i < n; ++i) Set(i, nd(rng));
  }
  void Set(size_t i, float v) {
    bits[i] = dt == DType::kBF16 ? FloatToBf16(v) : FloatToHalf(v);
    f[i] = dt == DType::kBF16 ? Bf16ToFloat(bits[i]) : HalfToFloat(bits[i]);
  }
};

float ToF(DType dt, uint16_t b) { return dt == DType::kBF16 ? Bf16ToFloat(b) : HalfToFloat(b); }

// Device copy of 16-bit values, or `n` poisoned (0xffff: NaN in bf16 and fp16) ones.
struct Dev {
  void* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, n * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xff, n * 2), cudaSuccess);
  }
  explicit Dev(const std::vector<uint16_t>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<float> Get(DType dt) const {
    std::vector<uint16_t> b(n);
    EXPECT_EQ(cudaMemcpy(b.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = ToF(dt, b[i]);
    return f;
  }
};

// rms_norm(x[m]) * g, in double.
std::vector<double> Normed(const std::vector<float>& x, const std::vector<float>& g, int64_t M, int64_t K, double eps) {
  std::vector<double> h(M * K);
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t k = 0; k < K; ++k) ss += static_cast<double>(x[m * K + k]) * x[m * K + k];
    const double r = 1.0 / std::sqrt(ss / K + eps);
    for (int64_t k = 0; k < K; ++k) h[m * K + k] = x[m * K + k] * r * g[k];
  }
  return h;
}

// y[m, n] = sum_k h[m, k] w[n, k].
std::vector<double> MatVec(const std::vector<double>& h, const std::vector<float>& w, int64_t M, int64_t N, int64_t K) {
  std::vector<double> y(M * N);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += h[m * K + k] * w[n * K + k];
      y[m * N + n] = s;
    }
  }
  return y;
}

// h[m, i] = silu(gu[m, i]) * gu[m, I + i]: the SwiGLU gate of [M, 2I] sums.
std::vector<float> Swiglu(const std::vector<double>& gu, int64_t M, int64_t I) {
  std::vector<float> h(M * I);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t i = 0; i < I; ++i) {
      const double a = gu[m * 2 * I + i], b = gu[m * 2 * I + I + i];
      h[m * I + i] = static_cast<float>(a / (1.0 + std::exp(-a)) * b);
    }
  }
  return h;
}

std::vector<float> ToFloats(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

bool AllFinite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

constexpr double kTol = 1e-2;  // bf16 output rounding is ~4e-3 relative

// A producer's fusion (o_proj, down): the residual add and the next norm's
// epilogue, its sums into sq[0, rows) and sq[rows, 2 rows) cleared.
cuda::GemvFusion Producer(const void* residual, const void* g, void* z, unsigned long long* sq, int64_t rows) {
  cuda::GemvFusion f;
  f.residual = residual;
  f.norm_next = g;
  f.norm_out = z;
  f.sq_out = sq;
  f.sq_clear = sq + rows;
  return f;
}

// Rows of the skinny GEMM's fused cases: one and several 8-row token tiles of
// the narrow kernel, and the Hopper kernel's 33-64 where there is one.
std::vector<int64_t> SkinnyRows() {
  std::vector<int64_t> rows = {2, 5, 16, 17, 32};
  if (cuda::SkinnyHopperAvailable()) rows.insert(rows.end(), {33, 48, 64});
  return rows;
}

class GemvFusedTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
};

// y = rstd * ((x * g) . w^T) (the LM head on the final norm), odd N included.
TEST_P(GemvFusedTest, NormLinear) {
  const DType dt = GetParam();
  std::mt19937 rng(11);
  for (int64_t M : {1, 2, 3, 8}) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{1001, 512}, {64, 2048}}) {
      Host x(dt, M * K, rng, 3.0f), w(dt, N * K, rng, 0.05f), g(dt, K, rng, 1.0f);
      Dev dx(x.bits), dw(w.bits), dg(g.bits), dy(M * N);
      cuda::GemvFusion f;
      f.norm_weight = dg.p;
      f.eps = 1e-5f;
      ASSERT_TRUE(cuda::LaunchGemvFused(dt, M, N, K, dx.p, dw.p, dy.p, f, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = dy.Get(dt);
      const std::vector<float> want = ToFloats(MatVec(Normed(x.f, g.f, M, K, 1e-5), w.f, M, N, K));
      ASSERT_TRUE(AllFinite(got)) << "M " << M << " N " << N;
      const double e = RelErrorNorm(got, want);
      EXPECT_LT(e, kTol) << "M " << M << " N " << N << " K " << K;
    }
  }
}

// y = x . w^T + residual (o_proj and down with the residual add).
TEST_P(GemvFusedTest, Residual) {
  const DType dt = GetParam();
  std::mt19937 rng(12);
  for (int64_t M : {1, 2, 4, 5}) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{512, 1536}, {2048, 512}, {2047, 8192}}) {
      Host x(dt, M * K, rng, 1.0f), w(dt, N * K, rng, 0.05f), r(dt, M * N, rng, 2.0f);
      Dev dx(x.bits), dw(w.bits), dr(r.bits), dy(M * N);
      cuda::GemvFusion f;
      f.residual = dr.p;
      ASSERT_TRUE(cuda::LaunchGemvFused(dt, M, N, K, dx.p, dw.p, dy.p, f, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<double> xd(x.f.begin(), x.f.end());
      std::vector<double> want = MatVec(xd, w.f, M, N, K);
      for (int64_t i = 0; i < M * N; ++i) want[i] += r.f[i];
      const std::vector<float> got = dy.Get(dt);
      ASSERT_TRUE(AllFinite(got));
      EXPECT_LT(RelErrorNorm(got, ToFloats(want)), kTol) << "M " << M << " N " << N;
    }
  }
}

// h = silu(n . gate^T) * (n . up^T), n = rms_norm(x) * g.
TEST_P(GemvFusedTest, SwigluNorm) {
  const DType dt = GetParam();
  std::mt19937 rng(13);
  for (int64_t M : {1, 2, 7}) {
    const int64_t D = 512, I = 1536;
    Host x(dt, M * D, rng, 2.0f), w(dt, 2 * I * D, rng, 0.05f), g(dt, D, rng, 1.0f);
    Dev dx(x.bits), dw(w.bits), dg(g.bits), dh(M * I);
    cuda::GemvFusion f;
    f.norm_weight = dg.p;
    f.eps = 1e-6f;
    ASSERT_TRUE(cuda::LaunchGemvSwigluFused(dt, M, D, I, dx.p, dw.p, dh.p, f, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> want = Swiglu(MatVec(Normed(x.f, g.f, M, D, 1e-6), w.f, M, 2 * I, D), M, I);
    const std::vector<float> got = dh.Get(dt);
    ASSERT_TRUE(AllFinite(got));
    EXPECT_LT(RelErrorNorm(got, want), kTol) << "M " << M;
  }
}

// The norm through the epilogues (GemvFusion::norm_next / sq_in): a
// producer y = x . w^T + residual also writes y * g and adds each row's sum
// of y^2 into sq_out (and zeroes sq_clear); the consumer (linear, the SwiGLU
// gate) on those equals the GEMV of rms_norm(y) * g. The residual stream y
// itself as in Residual; a consumer run twice gives the same bits.
TEST_P(GemvFusedTest, NormThroughEpilogues) {
  const DType dt = GetParam();
  std::mt19937 rng(15);
  constexpr int64_t kRows = cuda::kSkinnyMaxM;
  unsigned long long* dsq = nullptr;  // [0, kRows): the producer's sums, [kRows, 2 kRows): the ones it clears
  ASSERT_EQ(cudaMalloc(&dsq, 2 * kRows * sizeof(unsigned long long)), cudaSuccess);
  // The GEMV at its M tiles, the skinny GEMMs (skinny_gemm.h: the same
  // fusions for 2-64 rows), odd N tails.
  for (bool skinny : {false, true})
    for (int64_t M : skinny ? SkinnyRows() : std::vector<int64_t>{1, 2, 3, 8}) {
      SCOPED_TRACE(std::string(skinny ? "skinny" : "GEMV") + " M " + std::to_string(M));
      const int64_t K = 1536, D = 2048, N = skinny ? 1008 : 1001, I = 1536;
      Host x(dt, M * K, rng, 1.0f), w(dt, D * K, rng, 0.05f), r(dt, M * D, rng, 2.0f), g(dt, D, rng, 1.0f);
      Host w2(dt, N * D, rng, 0.05f), gu(dt, 2 * I * D, rng, 0.05f);
      Dev dx(x.bits), dw(w.bits), dr(r.bits), dg(g.bits), dw2(w2.bits), dgu(gu.bits);
      Dev dy(M * D), dz(M * D), dout(M * N), dout2(M * N), dh(M * I);
      ASSERT_EQ(cudaMemset(dsq, 0, kRows * sizeof(unsigned long long)), cudaSuccess);
      ASSERT_EQ(cudaMemset(dsq + kRows, 0xff, kRows * sizeof(unsigned long long)), cudaSuccess);
      auto linear = [&](int64_t n, int64_t k, const void* in, const void* wt, void* out, const cuda::GemvFusion& f) {
        return skinny ? cuda::LaunchSkinnyGemmFused(dt, M, n, k, in, wt, out, f, nullptr)
                      : cuda::LaunchGemvFused(dt, M, n, k, in, wt, out, f, nullptr);
      };
      ASSERT_TRUE(linear(D, K, dx.p, dw.p, dy.p, Producer(dr.p, dg.p, dz.p, dsq, kRows)).ok());
      cuda::GemvFusion cons;
      cons.sq_in = dsq;
      cons.eps = 1e-5f;
      ASSERT_TRUE(linear(N, D, dz.p, dw2.p, dout.p, cons).ok());
      ASSERT_TRUE(linear(N, D, dz.p, dw2.p, dout2.p, cons).ok());
      ASSERT_TRUE((skinny ? cuda::LaunchSkinnySwigluFused(dt, M, D, I, dz.p, dgu.p, dh.p, cons, nullptr)
                          : cuda::LaunchGemvSwigluFused(dt, M, D, I, dz.p, dgu.p, dh.p, cons, nullptr))
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      // The producer's y as stored, then the references from it.
      const std::vector<float> y = dy.Get(dt);
      ASSERT_TRUE(AllFinite(y));
      std::vector<double> xd(x.f.begin(), x.f.end());
      std::vector<double> yref = MatVec(xd, w.f, M, D, K);
      for (int64_t i = 0; i < M * D; ++i) yref[i] += r.f[i];
      EXPECT_LT(RelErrorNorm(y, ToFloats(yref)), kTol);
      const std::vector<double> hn = Normed(y, g.f, M, D, 1e-5);
      const std::vector<float> got = dout.Get(dt);
      ASSERT_TRUE(AllFinite(got));
      EXPECT_LT(RelErrorNorm(got, ToFloats(MatVec(hn, w2.f, M, N, D))), kTol);
      EXPECT_EQ(got, dout2.Get(dt));
      std::vector<unsigned long long> cleared(kRows);
      ASSERT_EQ(cudaMemcpy(cleared.data(), dsq + kRows, kRows * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (int64_t m = 0; m < M; ++m) EXPECT_EQ(cleared[m], 0u) << "row " << m << " of sq_clear";
      const std::vector<float> h = dh.Get(dt);
      ASSERT_TRUE(AllFinite(h));
      EXPECT_LT(RelErrorNorm(h, Swiglu(MatVec(hn, gu.f, M, 2 * I, D), M, I)), kTol);
    }
  cudaFree(dsq);
}

// A long-K producer above one token tile (down: K >= 2N, 9-64 rows), which
// LaunchSkinnyGemmFused hands to the Hopper skinny kernel where there is one:
// y = x . w^T + residual, z = y * g as stored, each row's sum of y^2 as
// stored in sq_out (fixed point), sq_clear zeroed; a second run gives the
// same bits.
TEST_P(GemvFusedTest, LongKProducer) {
  const DType dt = GetParam();
  std::mt19937 rng(16);
  constexpr int64_t kRows = cuda::kSkinnyMaxM;
  unsigned long long* dsq = nullptr;
  ASSERT_EQ(cudaMalloc(&dsq, 2 * kRows * sizeof(unsigned long long)), cudaSuccess);
  std::vector<int64_t> rows = {9, 16, 17, 32};
  if (cuda::SkinnyHopperAvailable()) rows.insert(rows.end(), {40, 64});
  for (int64_t M : rows)
    for (int64_t N : {2048, 1040}) {
      SCOPED_TRACE("M " + std::to_string(M) + " N " + std::to_string(N));
      const int64_t K = 8192;
      Host x(dt, M * K, rng, 1.0f), w(dt, N * K, rng, 0.02f), r(dt, M * N, rng, 2.0f), g(dt, N, rng, 1.0f);
      Dev dx(x.bits), dw(w.bits), dr(r.bits), dg(g.bits), dy(M * N), dz(M * N), dy2(M * N);
      const cuda::GemvFusion f = Producer(dr.p, dg.p, dz.p, dsq, kRows);
      std::vector<unsigned long long> sq[2];
      for (int run = 0; run < 2; ++run) {
        ASSERT_EQ(cudaMemset(dsq, 0, kRows * sizeof(unsigned long long)), cudaSuccess);
        ASSERT_EQ(cudaMemset(dsq + kRows, 0xff, kRows * sizeof(unsigned long long)), cudaSuccess);
        ASSERT_TRUE(cuda::LaunchSkinnyGemmFused(dt, M, N, K, dx.p, dw.p, run == 0 ? dy.p : dy2.p, f, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        sq[run].resize(2 * kRows);
        ASSERT_EQ(cudaMemcpy(sq[run].data(), dsq, 2 * kRows * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
      const std::vector<float> y = dy.Get(dt), z = dz.Get(dt);
      ASSERT_TRUE(AllFinite(y));
      ASSERT_TRUE(AllFinite(z));
      EXPECT_EQ(y, dy2.Get(dt));
      EXPECT_EQ(sq[0], sq[1]);
      std::vector<double> xd(x.f.begin(), x.f.end());
      std::vector<double> want = MatVec(xd, w.f, M, N, K);
      for (int64_t i = 0; i < M * N; ++i) want[i] += r.f[i];
      EXPECT_LT(RelErrorNorm(y, ToFloats(want)), kTol);
      std::vector<float> zwant(M * N);
      for (int64_t m = 0; m < M; ++m) {
        double ss = 0;
        for (int64_t n = 0; n < N; ++n) {
          const double v = y[m * N + n];
          zwant[m * N + n] = static_cast<float>(v * g.f[n]);
          ss += v * v;
        }
        const double got = static_cast<double>(sq[0][m]) / cuda::kNormSumScale;
        EXPECT_NEAR(got, ss, 1e-4 * ss + 1e-3) << "row " << m << " sum of squares";
        EXPECT_EQ(sq[0][kRows + m], 0u) << "row " << m << " of sq_clear";
      }
      EXPECT_LT(RelErrorNorm(z, zwant), kTol);
    }
  cudaFree(dsq);
}

// QKV with the norm folded in (the GEMV) or a producer's norm sums (the
// skinny GEMMs: x * weight in, sq_in) and the rope + paged cache
// epilogue: q (and dense k/v when asked) and the cache rows of each token's
// slot against qkv = rms_norm(x) . W^T (W in the plain order; the device gets
// its q/k head rows interleaved) rotated with a host cos/sin table; other
// slots untouched.
TEST_P(GemvFusedTest, QkvRopeKvCache) {
  const DType dt = GetParam();
  std::mt19937 rng(14);
  for (bool skinny : {false, true})
    for (int D : {64, 128}) {
      for (int64_t M : skinny ? SkinnyRows() : std::vector<int64_t>{1, 2, 3, 8}) {
        for (bool dense : {false, true}) {
          SCOPED_TRACE(std::string(skinny ? "skinny" : "GEMV") + " D " + std::to_string(D) + " M " + std::to_string(M) +
                       (dense ? " dense" : ""));
          // K = 896: 14 k tiles, so the Hopper kernel splits K over 7 ranks,
          // an odd share of features a rank before its pairs are rounded.
          const int Hq = 8, Hkv = 2, K = 896, half = D / 2, max_pos = 300, num_slots = 64;
          const int64_t N = static_cast<int64_t>(Hq + 2 * Hkv) * D;
          Host x(dt, M * K, rng, 2.0f), w(dt, N * K, rng, 0.05f), g(dt, K, rng, 1.0f);
          // Interleave each q/k head's rows i and i + D/2.
          std::vector<uint16_t> wi = w.bits;
          for (int h = 0; h < Hq + Hkv; ++h) {
            for (int i = 0; i < half; ++i) {
              std::memcpy(&wi[(static_cast<int64_t>(h) * D + 2 * i) * K],
                          &w.bits[(static_cast<int64_t>(h) * D + i) * K], K * 2);
              std::memcpy(&wi[(static_cast<int64_t>(h) * D + 2 * i + 1) * K],
                          &w.bits[(static_cast<int64_t>(h) * D + i + half) * K], K * 2);
            }
          }
          std::vector<float2> cs(static_cast<size_t>(max_pos) * half);
          for (int p = 0; p < max_pos; ++p) {
            for (int i = 0; i < half; ++i) {
              const double a = p * std::pow(500000.0, -2.0 * i / D);
              cs[p * half + i] = make_float2(static_cast<float>(std::cos(a)), static_cast<float>(std::sin(a)));
            }
          }
          std::vector<int32_t> pos(M), slot(M);
          std::vector<int32_t> perm(num_slots);
          for (int i = 0; i < num_slots; ++i) perm[i] = i;
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int64_t m = 0; m < M; ++m) {
            pos[m] = static_cast<int32_t>(rng() % max_pos);
            slot[m] = perm[m];
          }
          Dev dx(x.bits), dw(wi), dg(g.bits), dq(M * Hq * D), dk(M * Hkv * D), dv(M * Hkv * D);
          Dev kc(static_cast<size_t>(num_slots) * Hkv * D), vc(static_cast<size_t>(num_slots) * Hkv * D);
          float2* dcs = nullptr;
          int32_t *dpos = nullptr, *dslot = nullptr;
          ASSERT_EQ(cudaMalloc(&dcs, cs.size() * sizeof(float2)), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&dpos, M * 4), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&dslot, M * 4), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(dcs, cs.data(), cs.size() * sizeof(float2), cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(dpos, pos.data(), M * 4, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(dslot, slot.data(), M * 4, cudaMemcpyHostToDevice), cudaSuccess);
          cuda::GemvFusion f;
          f.eps = 1e-5f;
          f.rope_kv = true;
          f.rope = {dpos, dcs, dslot, dq.p, dense ? dk.p : nullptr, dense ? dv.p : nullptr, kc.p, vc.p, Hq, Hkv, D};
          // The skinny GEMM's norm comes from a producer: x * weight and each
          // row's sum of x^2 in fixed point (gemv.h's kNormSumScale).
          Host xg = x;
          for (int64_t i = 0; i < M * K; ++i) xg.Set(i, x.f[i] * g.f[i % K]);
          std::vector<unsigned long long> sq(M);
          for (int64_t m = 0; m < M; ++m) {
            double ss = 0;
            for (int64_t k = 0; k < K; ++k) ss += static_cast<double>(x.f[m * K + k]) * x.f[m * K + k];
            sq[m] = static_cast<unsigned long long>(std::llround(ss * cuda::kNormSumScale));
          }
          Dev dxg(xg.bits);
          unsigned long long* dsq = nullptr;
          ASSERT_EQ(cudaMalloc(&dsq, M * sizeof(unsigned long long)), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(dsq, sq.data(), M * sizeof(unsigned long long), cudaMemcpyHostToDevice), cudaSuccess);
          if (skinny) {
            f.sq_in = dsq;
            ASSERT_TRUE(cuda::LaunchSkinnyGemmFused(dt, M, N, K, dxg.p, dw.p, nullptr, f, nullptr).ok());
          } else {
            f.norm_weight = dg.p;
            ASSERT_TRUE(cuda::LaunchGemvFused(dt, M, N, K, dx.p, dw.p, nullptr, f, nullptr).ok());
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const std::vector<double> qkv = MatVec(Normed(x.f, g.f, M, K, 1e-5), w.f, M, N, K);
          // Reference q [M,Hq,D], k and v [M,Hkv,D].
          std::vector<float> wq(M * Hq * D), wk(M * Hkv * D), wv(M * Hkv * D);
          for (int64_t m = 0; m < M; ++m) {
            for (int h = 0; h < Hq + 2 * Hkv; ++h) {
              const double* src = &qkv[m * N + static_cast<int64_t>(h) * D];
              float* dst = h < Hq         ? &wq[(m * Hq + h) * D]
                           : h < Hq + Hkv ? &wk[(m * Hkv + h - Hq) * D]
                                          : &wv[(m * Hkv + h - Hq - Hkv) * D];
              for (int i = 0; i < half; ++i) {
                if (h < Hq + Hkv) {
                  const float2 c = cs[pos[m] * half + i];
                  dst[i] = static_cast<float>(src[i] * c.x - src[i + half] * c.y);
                  dst[i + half] = static_cast<float>(src[i + half] * c.x + src[i] * c.y);
                } else {
                  dst[i] = static_cast<float>(src[i]);
                  dst[i + half] = static_cast<float>(src[i + half]);
                }
              }
            }
          }
          const std::vector<float> gq = dq.Get(dt), gkc = kc.Get(dt), gvc = vc.Get(dt);
          ASSERT_TRUE(AllFinite(gq));
          EXPECT_LT(RelErrorNorm(gq, wq), kTol) << "q, D " << D << " M " << M;
          std::vector<float> got_k(M * Hkv * D), got_v(M * Hkv * D);
          for (int64_t m = 0; m < M; ++m) {
            std::memcpy(&got_k[m * Hkv * D], &gkc[static_cast<int64_t>(slot[m]) * Hkv * D], Hkv * D * 4);
            std::memcpy(&got_v[m * Hkv * D], &gvc[static_cast<int64_t>(slot[m]) * Hkv * D], Hkv * D * 4);
          }
          ASSERT_TRUE(AllFinite(got_k) && AllFinite(got_v)) << "D " << D << " M " << M;
          EXPECT_LT(RelErrorNorm(got_k, wk), kTol) << "k cache, D " << D << " M " << M;
          EXPECT_LT(RelErrorNorm(got_v, wv), kTol) << "v cache, D " << D << " M " << M;
          // Slots no row owns keep their poison.
          int64_t touched = 0;
          for (float v : gkc) touched += std::isfinite(v) ? 1 : 0;
          EXPECT_EQ(touched, M * Hkv * D);
          if (dense) {
            const std::vector<float> gk = dk.Get(dt), gv = dv.Get(dt);
            EXPECT_LT(RelErrorNorm(gk, wk), kTol) << "dense k";
            EXPECT_LT(RelErrorNorm(gv, wv), kTol) << "dense v";
          }
          cudaFree(dcs);
          cudaFree(dpos);
          cudaFree(dslot);
          cudaFree(dsq);
        }
      }
    }
}

// The rope epilogue's shape and tensor checks that every fused launcher
// (GEMV, register and Hopper skinny GEMMs) applies; host only, runs anywhere.
TEST(GemvRopeKvTest, ShapeAndTensorChecks) {
  cuda::GemvRopeKv r;
  r.Hq = 32;
  r.Hkv = 8;
  r.D = 64;
  EXPECT_TRUE(r.ShapeFits(48 * 64, 2));
  EXPECT_TRUE(r.ShapeFits(48 * 64, 16));
  EXPECT_FALSE(r.ShapeFits(48 * 64 + 2, 2));  // N not (Hq + 2 Hkv) D
  r.D = 6;
  EXPECT_TRUE(r.ShapeFits(48 * 6, 2));
  EXPECT_FALSE(r.ShapeFits(48 * 6, 16));  // the register kernels pair 16-wide tiles
  r.D = 0;
  EXPECT_FALSE(r.ShapeFits(0, 2));
  r.D = 64;
  r.Hkv = 0;
  EXPECT_FALSE(r.ShapeFits(32 * 64, 2));  // no kv heads
  int32_t pos = 0, slot = 0;
  float2 cs{};
  int q = 0, kc = 0, vc = 0;
  EXPECT_FALSE(r.TensorsPresent());
  r.positions = &pos;
  r.cos_sin = &cs;
  r.q = &q;
  EXPECT_TRUE(r.TensorsPresent());  // no cache write
  r.slots = &slot;
  r.k_cache = &kc;
  EXPECT_FALSE(r.TensorsPresent());  // slots without the v cache
  r.v_cache = &vc;
  EXPECT_TRUE(r.TensorsPresent());
}

// Host-only: which epilogue combinations every fused projection launcher takes.
TEST(GemvFusionTest, EpiloguesCombine) {
  int res = 0, g = 0, out = 0;
  unsigned long long sq[2] = {};
  cuda::GemvFusion f;
  EXPECT_TRUE(f.EpiloguesCombine());  // none
  f.residual = &res;
  EXPECT_TRUE(f.EpiloguesCombine());  // o_proj / down without the next norm
  f.norm_next = &g;
  f.norm_out = &out;
  f.sq_out = sq;
  f.sq_clear = sq + 1;
  EXPECT_TRUE(f.NormNextConsistent());
  EXPECT_TRUE(f.EpiloguesCombine());  // and with it
  f.residual = nullptr;
  EXPECT_FALSE(f.EpiloguesCombine());  // the next norm normalises a residual sum
  cuda::GemvFusion r;
  r.rope_kv = true;
  EXPECT_TRUE(r.EpiloguesCombine());  // QKV
  r.residual = &res;
  EXPECT_FALSE(r.EpiloguesCombine());  // rope writes q and the cache, never a residual sum
}

// Host-only: the built-in rule's GEMV rows (linear.h).
TEST(GemvByDefaultTest, OneAndTwoRows) {
  if (std::getenv("FUSEDSERVE_GEMV_MAX_M") != nullptr) GTEST_SKIP() << "FUSEDSERVE_GEMV_MAX_M overrides the rule";
  EXPECT_TRUE(cuda::GemvByDefault(1));
  EXPECT_TRUE(cuda::GemvByDefault(2));   // every projection of a two-row decode step
  EXPECT_FALSE(cuda::GemvByDefault(3));  // the skinny GEMM from three rows
  EXPECT_FALSE(cuda::GemvByDefault(8));
}

// Host-only: the GEMV's wave plans on the shapes it was measured on, for an
// H200's 132 SMs: 6 one-row blocks an SM, or 4 under the cap.
TEST(GemvGridTest, TheCappedWaveWhereItKeepsTheWarps) {
  const int64_t natural = 132 * 6 * cuda::kGemvWarps, capped = 132 * 4 * cuda::kGemvWarps;
  // llama-3.2-1b down and o_proj (1,024 row pairs): two warps a pair either
  // way, the same 512 blocks: capped.
  cuda::GemvGrid n = cuda::PlanGemvGrid(1024, natural), c = cuda::PlanGemvGrid(1024, capped);
  EXPECT_EQ(n.split, 2);
  EXPECT_EQ(n.blocks, 512);
  EXPECT_EQ(c.blocks, 512);
  EXPECT_TRUE(cuda::GemvTakesCappedGrid(n, c));
  // Its QKV (1,536 pairs): split over two warps only when 6 blocks fit, so
  // the cap would halve the warps: not capped.
  n = cuda::PlanGemvGrid(1536, natural);
  c = cuda::PlanGemvGrid(1536, capped);
  EXPECT_EQ(n.Warps(), 3072);
  EXPECT_EQ(c.Warps(), 1536);
  EXPECT_FALSE(cuda::GemvTakesCappedGrid(n, c));
  // Its SwiGLU gate_up (8,192 gate/up pairs): 3 pairs a warp or 4, three
  // quarters of the warps: capped.
  n = cuda::PlanGemvGrid(8192, natural);
  c = cuda::PlanGemvGrid(8192, capped);
  EXPECT_EQ(n.units_per_warp, 3);
  EXPECT_EQ(c.units_per_warp, 4);
  EXPECT_TRUE(cuda::GemvTakesCappedGrid(n, c));
  // Every unit is covered once: groups x units a warp >= units, one group fewer would not.
  for (int64_t units : {1, 7, 1024, 1536, 3072, 8192, 64128}) {
    for (int64_t warps : {natural, capped}) {
      const cuda::GemvGrid g = cuda::PlanGemvGrid(units, warps);
      EXPECT_GE(g.groups * g.units_per_warp, units) << units;
      EXPECT_LT((g.groups - 1) * g.units_per_warp, units) << units;
      EXPECT_LE(g.Warps(), warps) << units;
      EXPECT_EQ(g.blocks, (g.groups + cuda::kGemvWarps / g.split - 1) / (cuda::kGemvWarps / g.split)) << units;
    }
  }
}

// Host-only: how the kernels' environment knobs (FUSEDSERVE_GEMV_SM_BLOCKS and
// the others) are read.
TEST(EnvKnobTest, WholeIntegersInRangeElseTheFallback) {
  const char* name = "FUSEDSERVE_ENV_KNOB_TEST";
  unsetenv(name);
  EXPECT_EQ(cuda::EnvKnob(name, 0, 8, 4), 4);
  for (auto [value, want] : std::vector<std::pair<const char*, int>>{
           {"0", 0}, {"8", 8}, {"3", 3}, {"", 4}, {"9", 4}, {"-1", 4}, {"2x", 4}, {"x", 4}, {"99999999999999", 4}}) {
    setenv(name, value, 1);
    EXPECT_EQ(cuda::EnvKnob(name, 0, 8, 4), want) << "'" << value << "'";
  }
  unsetenv(name);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GemvFusedTest, ::testing::Values(DType::kBF16, DType::kF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(i.param == DType::kBF16 ? "bf16" : "fp16");
                         });

}  // namespace
}  // namespace fusedserve
