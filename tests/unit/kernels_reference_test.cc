// The CPU reference ops (kernels/cpu/reference.h) against formulas written
// again here, independently, in double precision; then the CpuBackend end to
// end on random requests for every op and float dtype.
//
// Every case draws fresh random inputs from its own seed, poisons outputs with
// NaN before the call (so an element the op forgets to write fails the check)
// and compares with the relative error norm ||got - want|| / ||want||.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/reference.h"
#include "kernels/op.h"

namespace fusedserve {
namespace {

constexpr double kTol = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using Vec = std::vector<float>;
using DVec = std::vector<double>;

// Uniform in [lo, hi); the seed mixes in the case's shape so no two cases share inputs.
Vec Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Vec Poisoned(int64_t n) { return Vec(n, kNaN); }

uint32_t Seed(std::initializer_list<int64_t> parts) {
  uint32_t h = 2166136261u;
  for (int64_t p : parts) h = (h ^ static_cast<uint32_t>(p)) * 16777619u;
  return h;
}

// ||got - want|| / ||want||; NaN (and so a failure) when got holds NaN.
double RelErr(const Vec& got, const DVec& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = got[i] - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

#define EXPECT_CLOSE(got, want)                                 \
  do {                                                          \
    ASSERT_EQ((got).size(), (want).size());                     \
    const double rel_err_ = RelErr((got), (want));              \
    EXPECT_LE(rel_err_, kTol) << "relative error " << rel_err_; \
  } while (false)

double SigmoidD(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// ---- norms --------------------------------------------------------------------

struct NormShape {
  int64_t M, H;
};
const NormShape kNormShapes[] = {{1, 1}, {1, 7}, {3, 1}, {3, 7}, {3, 769}, {17, 7}, {17, 769}, {3, 4096}, {17, 4096}};

DVec RmsNormRef(const Vec& x, const Vec& w, int64_t M, int64_t H, double eps) {
  DVec y(M * H);
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0.0;
    for (int64_t h = 0; h < H; ++h) ss += std::pow(static_cast<double>(x[m * H + h]), 2);
    const double rms = std::sqrt(ss / H + eps);
    for (int64_t h = 0; h < H; ++h) y[m * H + h] = x[m * H + h] / rms * w[h];
  }
  return y;
}

TEST(CpuReference, RmsNorm) {
  for (const auto [M, H] : kNormShapes) {
    for (float eps : {1e-5f, 1e-1f}) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " H=" << H << " eps=" << eps);
      const Vec x = Random(M * H, Seed({1, M, H})), w = Random(H, Seed({2, M, H}), 0.5f, 1.5f);
      Vec y = Poisoned(M * H);
      cpu::RmsNorm(x.data(), w.data(), M, H, eps, y.data());
      EXPECT_CLOSE(y, RmsNormRef(x, w, M, H, eps));
    }
  }
}

TEST(CpuReference, AddRmsNorm) {
  for (const auto [M, H] : kNormShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " H=" << H);
    const Vec x = Random(M * H, Seed({3, M, H})), r = Random(M * H, Seed({4, M, H}));
    const Vec w = Random(H, Seed({5, M, H}), 0.5f, 1.5f);
    Vec y = Poisoned(M * H), r_out = Poisoned(M * H);
    cpu::AddRmsNorm(x.data(), r.data(), w.data(), M, H, 1e-5f, y.data(), r_out.data());
    Vec sum(M * H);
    DVec sum_d(M * H);
    for (int64_t i = 0; i < M * H; ++i) {
      sum_d[i] = static_cast<double>(x[i]) + r[i];
      sum[i] = static_cast<float>(sum_d[i]);
    }
    EXPECT_EQ(r_out, sum) << "residual_out must be the fp32 sum x + residual";
    EXPECT_CLOSE(r_out, sum_d);
    EXPECT_CLOSE(y, RmsNormRef(sum, w, M, H, 1e-5));
  }
}

TEST(CpuReference, AddRmsNormSilu) {
  for (const auto [M, H] : kNormShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " H=" << H);
    const Vec x = Random(M * H, Seed({6, M, H})), r = Random(M * H, Seed({7, M, H}));
    const Vec w = Random(H, Seed({8, M, H}), 0.5f, 1.5f);
    Vec y = Poisoned(M * H);
    cpu::AddRmsNormSilu(x.data(), r.data(), w.data(), M, H, 1e-5f, y.data());
    DVec want(M * H);
    for (int64_t m = 0; m < M; ++m) {
      double ss = 0.0;
      for (int64_t h = 0; h < H; ++h) ss += std::pow(static_cast<double>(x[m * H + h]) + r[m * H + h], 2);
      const double rms = std::sqrt(ss / H + 1e-5);
      for (int64_t h = 0; h < H; ++h) {
        const double n = (static_cast<double>(x[m * H + h]) + r[m * H + h]) / rms * w[h];
        want[m * H + h] = n * SigmoidD(n);
      }
    }
    EXPECT_CLOSE(y, want);
  }
}

TEST(CpuReference, LayerNorm) {
  for (const auto [M, H] : kNormShapes) {
    // offset 100: rows with a large mean, where a one-pass E[x^2] - E[x]^2 in fp32 would cancel.
    for (float offset : {0.0f, 100.0f}) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " H=" << H << " offset=" << offset);
      const Vec x = Random(M * H, Seed({9, M, H}), offset - 1.0f, offset + 1.0f);
      const Vec w = Random(H, Seed({10, M, H}), 0.5f, 1.5f), b = Random(H, Seed({11, M, H}));
      Vec y = Poisoned(M * H);
      cpu::LayerNorm(x.data(), w.data(), b.data(), M, H, 1e-5f, y.data());
      DVec want(M * H);
      for (int64_t m = 0; m < M; ++m) {
        double mean = 0.0;
        for (int64_t h = 0; h < H; ++h) mean += x[m * H + h];
        mean /= H;
        double var = 0.0;
        for (int64_t h = 0; h < H; ++h) var += std::pow(x[m * H + h] - mean, 2);
        var /= H;  // biased
        for (int64_t h = 0; h < H; ++h) want[m * H + h] = (x[m * H + h] - mean) / std::sqrt(var + 1e-5) * w[h] + b[h];
      }
      EXPECT_CLOSE(y, want);
    }
  }
}

// ---- softmax, activations ----------------------------------------------------

TEST(CpuReference, Softmax) {
  // lo/hi 300..700: logits whose exp overflows fp32 (but not double, so the
  // naive formula below stays valid) -- only a max-subtracted softmax survives.
  struct Range {
    float lo, hi;
  };
  for (const auto [M, N] : kNormShapes) {
    for (const Range range : {Range{-1.0f, 1.0f}, Range{-20.0f, 20.0f}, Range{300.0f, 700.0f}}) {
      SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " range=" << range.lo << ".." << range.hi);
      const Vec x = Random(M * N, Seed({12, M, N, static_cast<int64_t>(range.hi)}), range.lo, range.hi);
      Vec y = Poisoned(M * N);
      cpu::Softmax(x.data(), M, N, y.data());
      DVec want(M * N);
      for (int64_t m = 0; m < M; ++m) {
        double z = 0.0;
        for (int64_t n = 0; n < N; ++n) z += std::exp(static_cast<double>(x[m * N + n]));
        for (int64_t n = 0; n < N; ++n) want[m * N + n] = std::exp(static_cast<double>(x[m * N + n])) / z;
      }
      EXPECT_CLOSE(y, want);
    }
  }
}

TEST(CpuReference, SiluAndMul) {
  for (const auto [M, I] : kNormShapes) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " I=" << I);
    const Vec x = Random(M * 2 * I, Seed({13, M, I}), -4.0f, 4.0f);
    Vec y = Poisoned(M * I);
    cpu::SiluAndMul(x.data(), M, I, y.data());
    DVec want(M * I);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t i = 0; i < I; ++i) {
        const double g = x[m * 2 * I + i], u = x[m * 2 * I + I + i];
        want[m * I + i] = g * SigmoidD(g) * u;
      }
    }
    EXPECT_CLOSE(y, want);
  }
}

// Written differently from the op on purpose: erf form through erfc; tanh form
// through 0.5 * (1 + tanh(z)) = sigmoid(2z).
double GeluErfRef(double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }
double GeluTanhRef(double v) {
  const double z = std::sqrt(2.0 / 3.14159265358979323846) * (v + 0.044715 * v * v * v);
  return v * SigmoidD(2.0 * z);
}

TEST(CpuReference, Gelu) {
  for (int64_t n : {1, 7, 769, 4096 * 3}) {
    for (bool tanh_approx : {false, true}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " tanh=" << tanh_approx);
      const Vec x = Random(n, Seed({14, n, tanh_approx}), -6.0f, 6.0f);
      Vec y = Poisoned(n);
      cpu::Gelu(x.data(), n, tanh_approx, y.data());
      DVec want(n);
      for (int64_t i = 0; i < n; ++i) want[i] = tanh_approx ? GeluTanhRef(x[i]) : GeluErfRef(x[i]);
      EXPECT_CLOSE(y, want);
    }
  }
  // The two forms differ (by ~4.4e-4 at |x| = 2.5): make sure the flag is honoured.
  const float x = 2.5f;
  float erf_y = kNaN, tanh_y = kNaN;
  cpu::Gelu(&x, 1, false, &erf_y);
  cpu::Gelu(&x, 1, true, &tanh_y);
  EXPECT_NEAR(erf_y, GeluErfRef(2.5), 1e-6);
  EXPECT_NEAR(tanh_y, GeluTanhRef(2.5), 1e-6);
  EXPECT_GT(std::fabs(erf_y - tanh_y), 3e-4);
}

// ---- rope -----------------------------------------------------------------------

// Rotate-half RoPE as a complex rotation of (x[i], x[i + D/2]) by pos * theta^(-2i/D).
DVec RopeRef(const Vec& x, const std::vector<int64_t>& pos, int64_t T, int64_t H, int64_t D, double theta) {
  DVec out(T * H * D);
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = (t * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos[t] * std::exp(-(2.0 * i / D) * std::log(theta));
        const std::complex<double> z = std::complex<double>(x[base + i], x[base + i + half]) * std::polar(1.0, angle);
        out[base + i] = z.real();
        out[base + i + half] = z.imag();
      }
    }
  }
  return out;
}

TEST(CpuReference, Rope) {
  struct Case {
    int64_t T, Hq, Hkv, D;
    double theta;
    int64_t max_pos;
  };
  const Case cases[] = {{1, 1, 1, 2, 10000.0, 10},
                        {3, 4, 1, 8, 10000.0, 100},
                        {17, 4, 4, 64, 500000.0, 8192},
                        {5, 8, 2, 128, 500000.0, 131072},
                        {3, 2, 1, 128, 10000.0, 4096}};
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "T=" << c.T << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
                                    << " theta=" << c.theta);
    const Vec q = Random(c.T * c.Hq * c.D, Seed({15, c.T, c.Hq, c.D}));
    const Vec k = Random(c.T * c.Hkv * c.D, Seed({16, c.T, c.Hkv, c.D}));
    std::mt19937 rng(Seed({17, c.T, c.D}));
    std::uniform_int_distribution<int64_t> pos_dist(1, c.max_pos);
    std::vector<int64_t> pos(c.T);
    for (int64_t& p : pos) p = pos_dist(rng);  // non-zero, unordered, repeats allowed
    Vec q_out = Poisoned(q.size()), k_out = Poisoned(k.size());
    cpu::Rope(q.data(), k.data(), pos.data(), c.T, c.Hq, c.Hkv, c.D, c.theta, q_out.data(), k_out.data());
    EXPECT_CLOSE(q_out, RopeRef(q, pos, c.T, c.Hq, c.D, c.theta));
    EXPECT_CLOSE(k_out, RopeRef(k, pos, c.T, c.Hkv, c.D, c.theta));
  }
}

TEST(CpuReference, RopeAtPositionZeroIsIdentity) {
  const int64_t T = 2, H = 3, D = 16;
  const Vec q = Random(T * H * D, 18), k = Random(T * H * D, 19);
  const std::vector<int64_t> pos = {0, 0};
  Vec q_out = Poisoned(q.size()), k_out = Poisoned(k.size());
  cpu::Rope(q.data(), k.data(), pos.data(), T, H, H, D, 500000.0, q_out.data(), k_out.data());
  EXPECT_EQ(q_out, q);
  EXPECT_EQ(k_out, k);
}

// ---- gemm --------------------------------------------------------------------------

TEST(CpuReference, Linear) {
  struct Shape {
    int64_t M, K, N;
  };
  const Shape shapes[] = {{1, 1, 1}, {3, 7, 5}, {17, 769, 33}, {1, 4096, 17}, {3, 4096, 7}, {17, 5, 769}};
  const Activation acts[] = {Activation::kNone, Activation::kGeluErf, Activation::kGeluTanh, Activation::kSilu};
  for (const Shape& s : shapes) {
    for (Activation act : acts) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(testing::Message() << "M=" << s.M << " K=" << s.K << " N=" << s.N
                                        << " act=" << static_cast<int>(act) << " bias=" << with_bias);
        const Vec x = Random(s.M * s.K, Seed({20, s.M, s.K, s.N}));
        const Vec w =
            Random(s.N * s.K, Seed({21, s.M, s.K, s.N}), -2.0f / std::sqrt(float(s.K)), 2.0f / std::sqrt(float(s.K)));
        const Vec b = Random(s.N, Seed({22, s.M, s.K, s.N}));
        Vec y = Poisoned(s.M * s.N);
        cpu::Linear(x.data(), w.data(), with_bias ? b.data() : nullptr, s.M, s.K, s.N, act, y.data());
        DVec want(s.M * s.N);
        for (int64_t m = 0; m < s.M; ++m) {
          for (int64_t n = 0; n < s.N; ++n) {
            double v = with_bias ? b[n] : 0.0;
            for (int64_t k = 0; k < s.K; ++k) v += static_cast<double>(x[m * s.K + k]) * w[n * s.K + k];
            switch (act) {
              case Activation::kNone:
                break;
              case Activation::kGeluErf:
                v = GeluErfRef(v);
                break;
              case Activation::kGeluTanh:
                v = GeluTanhRef(v);
                break;
              case Activation::kSilu:
                v = v * SigmoidD(v);
                break;
            }
            want[m * s.N + n] = v;
          }
        }
        EXPECT_CLOSE(y, want);
      }
    }
  }
}

TEST(CpuReference, SwigluMlp) {
  struct Shape {
    int64_t M, D, I;
  };
  const Shape shapes[] = {{1, 1, 1}, {3, 7, 5}, {17, 64, 96}, {3, 769, 33}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "M=" << s.M << " D=" << s.D << " I=" << s.I);
    const Vec x = Random(s.M * s.D, Seed({23, s.M, s.D, s.I}));
    const float sd = 2.0f / std::sqrt(float(s.D)), si = 2.0f / std::sqrt(float(s.I));
    const Vec gate_up = Random(2 * s.I * s.D, Seed({24, s.M, s.D, s.I}), -sd, sd);
    const Vec down = Random(s.D * s.I, Seed({25, s.M, s.D, s.I}), -si, si);
    Vec y = Poisoned(s.M * s.D);
    cpu::SwigluMlp(x.data(), gate_up.data(), down.data(), s.M, s.D, s.I, y.data());
    DVec want(s.M * s.D);
    for (int64_t m = 0; m < s.M; ++m) {
      DVec h(s.I);
      for (int64_t i = 0; i < s.I; ++i) {
        double g = 0.0, u = 0.0;
        for (int64_t d = 0; d < s.D; ++d) {
          g += static_cast<double>(x[m * s.D + d]) * gate_up[i * s.D + d];
          u += static_cast<double>(x[m * s.D + d]) * gate_up[(s.I + i) * s.D + d];
        }
        h[i] = g * SigmoidD(g) * u;
      }
      for (int64_t d = 0; d < s.D; ++d) {
        double acc = 0.0;
        for (int64_t i = 0; i < s.I; ++i) acc += h[i] * down[d * s.I + i];
        want[m * s.D + d] = acc;
      }
    }
    EXPECT_CLOSE(y, want);
  }
}

// ---- attention -------------------------------------------------------------------

// Prefill attention the textbook way: per sequence and head, the full score
// matrix Q K^T * scale, masked entries set to -inf, row softmax, times V.
DVec AttentionRef(const Vec& q, const Vec& k, const Vec& v, const std::vector<int64_t>& seq_lens, int64_t T, int64_t Hq,
                  int64_t Hkv, int64_t D, bool causal, double scale) {
  DVec o(T * Hq * D, 0.0);
  int64_t start = 0;
  for (int64_t len : seq_lens) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h * Hkv / Hq;  // == h / (Hq / Hkv)
      std::vector<DVec> p(len, DVec(len));
      for (int64_t i = 0; i < len; ++i) {
        for (int64_t j = 0; j < len; ++j) {
          double s = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            s += static_cast<double>(q[((start + i) * Hq + h) * D + d]) * k[((start + j) * Hkv + kvh) * D + d];
          }
          p[i][j] = (causal && j > i) ? -std::numeric_limits<double>::infinity() : s * scale;
        }
        double mx = -std::numeric_limits<double>::infinity(), z = 0.0;
        for (double s : p[i]) mx = std::max(mx, s);
        for (double& s : p[i]) z += (s = std::exp(s - mx));
        for (double& s : p[i]) s /= z;
      }
      for (int64_t i = 0; i < len; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < len; ++j) acc += p[i][j] * v[((start + j) * Hkv + kvh) * D + d];
          o[((start + i) * Hq + h) * D + d] = acc;
        }
      }
    }
    start += len;
  }
  return o;
}

struct AttnCase {
  std::vector<int64_t> seq_lens;
  int64_t Hq, Hkv, D;
  bool causal;
  double scale;  // 0: 1/sqrt(D)
};

TEST(CpuReference, Attention) {
  const AttnCase cases[] = {
      {{1}, 1, 1, 1, true, 0},             // single token
      {{17}, 4, 4, 16, true, 0},           // GQA ratio 1 (MHA)
      {{17}, 8, 2, 16, true, 0},           // GQA ratio 4
      {{13}, 4, 1, 64, true, 0.3},         // MQA, explicit scale
      {{1, 5, 3, 17}, 8, 2, 8, true, 0},   // several sequences, one of length 1
      {{1, 5, 3, 17}, 4, 4, 8, false, 0},  // several sequences, not causal
      {{7, 9}, 4, 1, 128, false, 0.05},    // non-causal MQA
      {{33, 2, 12}, 12, 4, 64, true, 0},   // GQA ratio 3
  };
  for (const AttnCase& c : cases) {
    int64_t T = 0;
    for (int64_t l : c.seq_lens) T += l;
    const int64_t B = static_cast<int64_t>(c.seq_lens.size());
    const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
    SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
                                    << " causal=" << c.causal);
    // Inputs in [-2, 2) so the softmax is far from uniform and masking errors show.
    const Vec q = Random(T * c.Hq * c.D, Seed({26, T, c.Hq, c.D}), -2.0f, 2.0f);
    const Vec k = Random(T * c.Hkv * c.D, Seed({27, T, c.Hkv, c.D}), -2.0f, 2.0f);
    const Vec v = Random(T * c.Hkv * c.D, Seed({28, T, c.Hkv, c.D}));
    Vec o = Poisoned(q.size());
    cpu::Attention(q.data(), k.data(), v.data(), c.seq_lens.data(), B, T, c.Hq, c.Hkv, c.D, c.causal,
                   static_cast<float>(scale), o.data());
    EXPECT_CLOSE(o, AttentionRef(q, k, v, c.seq_lens, T, c.Hq, c.Hkv, c.D, c.causal, static_cast<float>(scale)));
  }
}

// Causal: changing keys/values at positions > i must not change query i's
// output; the first token of each sequence sees only itself (o = v); and
// sequences never see each other.
TEST(CpuReference, AttentionCausalMaskAndSequenceIsolation) {
  const std::vector<int64_t> seq_lens = {6, 9};
  const int64_t T = 15, Hq = 4, Hkv = 2, D = 8, B = 2;
  const float scale = 0.5f;
  const Vec q = Random(T * Hq * D, 29), k = Random(T * Hkv * D, 30), v = Random(T * Hkv * D, 31);
  Vec base = Poisoned(q.size());
  cpu::Attention(q.data(), k.data(), v.data(), seq_lens.data(), B, T, Hq, Hkv, D, true, scale, base.data());

  // First token of each sequence: exactly its own v (softmax over one key is 1).
  for (int64_t start : {0, 6}) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_FLOAT_EQ(base[(start * Hq + h) * D + d], v[(start * Hkv + h / 2) * D + d]);
      }
    }
  }
  // Perturb K/V at token 3 (sequence 0) and 10 (sequence 1).
  for (int64_t changed : {3, 10}) {
    Vec k2 = k, v2 = v;
    for (int64_t i = changed * Hkv * D; i < (changed + 1) * Hkv * D; ++i) {
      k2[i] += 0.75f;
      v2[i] -= 0.5f;
    }
    Vec o = Poisoned(q.size());
    cpu::Attention(q.data(), k2.data(), v2.data(), seq_lens.data(), B, T, Hq, Hkv, D, true, scale, o.data());
    const int64_t seq_end = changed < 6 ? 6 : 15;
    for (int64_t t = 0; t < T; ++t) {
      const bool may_change = t >= changed && t < seq_end;
      bool same = true;
      for (int64_t i = t * Hq * D; i < (t + 1) * Hq * D; ++i) same = same && o[i] == base[i];
      EXPECT_EQ(same, !may_change) << "token " << t << " after changing token " << changed;
    }
  }
}

TEST(CpuReference, AttentionDecode) {
  struct Case {
    std::vector<int64_t> lengths;
    int64_t L, Hq, Hkv, D;
  };
  const Case cases[] = {
      {{1}, 1, 1, 1, 1},
      {{5, 1, 19, 12}, 19, 4, 4, 16},  // mixed lengths, GQA ratio 1
      {{5, 1, 19, 12}, 19, 8, 2, 64},  // mixed lengths, GQA ratio 4
      {{33, 7, 2}, 40, 4, 1, 128},     // MQA, lengths < L
  };
  for (const Case& c : cases) {
    const int64_t B = static_cast<int64_t>(c.lengths.size());
    SCOPED_TRACE(testing::Message() << "B=" << B << " L=" << c.L << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D);
    const Vec q = Random(B * c.Hq * c.D, Seed({32, B, c.L, c.Hq, c.D}), -2.0f, 2.0f);
    Vec kc = Random(B * c.L * c.Hkv * c.D, Seed({33, B, c.L, c.Hkv, c.D}), -2.0f, 2.0f);
    Vec vc = Random(B * c.L * c.Hkv * c.D, Seed({34, B, c.L, c.Hkv, c.D}));
    // Cache rows past each sequence's length are garbage: NaN must not leak.
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = (b * c.L + c.lengths[b]) * c.Hkv * c.D; i < (b + 1) * c.L * c.Hkv * c.D; ++i) {
        kc[i] = vc[i] = kNaN;
      }
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    Vec o = Poisoned(q.size());
    cpu::AttentionDecode(q.data(), kc.data(), vc.data(), c.lengths.data(), B, c.L, c.Hq, c.Hkv, c.D, scale, o.data());
    DVec want(q.size());
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        const int64_t kvh = h * c.Hkv / c.Hq;
        const int64_t n = c.lengths[b];
        DVec w(n);
        double z = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          double s = 0.0;
          for (int64_t d = 0; d < c.D; ++d) {
            s += static_cast<double>(q[(b * c.Hq + h) * c.D + d]) * kc[((b * c.L + j) * c.Hkv + kvh) * c.D + d];
          }
          // |s * scale| is small here, so exp without max-subtraction is safe in double.
          z += (w[j] = std::exp(s * scale));
        }
        for (int64_t d = 0; d < c.D; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < n; ++j) acc += w[j] * vc[((b * c.L + j) * c.Hkv + kvh) * c.D + d];
          want[(b * c.Hq + h) * c.D + d] = acc / z;
        }
      }
    }
    EXPECT_CLOSE(o, want);
  }
}

// Decode for a sequence of length n equals the last row of causal prefill.
TEST(CpuReference, AttentionDecodeMatchesPrefillLastRow) {
  const int64_t n = 11, Hq = 8, Hkv = 2, D = 32;
  const Vec q = Random(n * Hq * D, 35), k = Random(n * Hkv * D, 36), v = Random(n * Hkv * D, 37);
  const std::vector<int64_t> seq_lens = {n};
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Vec prefill = Poisoned(q.size());
  cpu::Attention(q.data(), k.data(), v.data(), seq_lens.data(), 1, n, Hq, Hkv, D, true, scale, prefill.data());
  Vec decode = Poisoned(Hq * D);
  cpu::AttentionDecode(q.data() + (n - 1) * Hq * D, k.data(), v.data(), seq_lens.data(), 1, n, Hq, Hkv, D, scale,
                       decode.data());
  DVec last(prefill.begin() + (n - 1) * Hq * D, prefill.end());
  EXPECT_CLOSE(decode, last);
}

// ---- CpuBackend end to end ----------------------------------------------------------

std::vector<int64_t> SmallKey(const std::string& op) {
  if (op == "rope") return {5, 4, 2, 16};
  if (op == "linear") return {3, 17, 33};
  if (op == "swiglu_mlp") return {3, 16, 24};
  if (op == "attention") return {7, 4, 2, 8};
  if (op == "attention_decode") return {2, 9, 4, 1, 8};
  if (op == "silu_and_mul") return {3, 7};
  return {3, 769};
}

TEST(CpuBackend, EveryOpEveryFloatDType) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "cpu");
  for (const OpSpec& spec : AllOpSpecs()) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      SCOPED_TRACE(spec.name + " " + DTypeName(dt));
      const OpRequest req = MakeRandomRequest(spec.name, dt, SmallKey(spec.name), Seed({38, int64_t(dt)}));
      absl::StatusOr<TensorMap> out = backend->Run(req);
      ASSERT_TRUE(out.ok()) << out.status();
      const auto shapes = OutputShapes(req);
      ASSERT_EQ(out->size(), spec.outputs.size());
      ASSERT_EQ(shapes.size(), spec.outputs.size());
      for (const auto& [name, shape] : shapes) {
        ASSERT_EQ(out->count(name), 1u) << "missing output " << name;
        EXPECT_NE(std::find(spec.outputs.begin(), spec.outputs.end(), name), spec.outputs.end());
        const HostTensor& t = out->at(name);
        EXPECT_EQ(t.dtype, dt);
        EXPECT_EQ(t.shape, shape);
        ASSERT_EQ(t.data.size(), static_cast<size_t>(t.numel()) * DTypeSize(dt));
        const Vec values = t.ToFloat();
        int64_t non_finite = 0, zeros = 0;
        for (float x : values) {
          non_finite += !std::isfinite(x);
          zeros += x == 0.0f;
        }
        EXPECT_EQ(non_finite, 0) << name;
        EXPECT_LT(zeros, t.numel()) << name << " is all zeros";
      }
    }
  }
}

// Backend outputs are the reference's fp32 result rounded once to the dtype,
// computed from the dtype's inputs widened exactly.
TEST(CpuBackend, OutputsAreRoundedReference) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    SCOPED_TRACE(DTypeName(dt));
    const OpRequest req = MakeRandomRequest("rms_norm", dt, {3, 769}, 39);
    absl::StatusOr<TensorMap> out = backend->Run(req);
    ASSERT_TRUE(out.ok()) << out.status();
    const Vec x = req.in("x").ToFloat(), w = req.in("weight").ToFloat();
    Vec y = Poisoned(x.size());
    cpu::RmsNorm(x.data(), w.data(), 3, 769, 1e-5f, y.data());
    EXPECT_EQ(out->at("y").data, HostTensor::FromFloat(dt, {3, 769}, y).data);
  }
}

TEST(CpuBackend, AttributesAreHonoured) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  // linear: bias + every activation.
  for (const char* act : {"none", "gelu", "gelu_tanh", "silu"}) {
    SCOPED_TRACE(act);
    OpRequest req = MakeRandomRequest("linear", DType::kF32, {3, 17, 33}, 40);
    req.attrs["activation"] = std::string(act);
    req.inputs["bias"] = HostTensor::FromFloat(DType::kF32, {17}, Random(17, 41));
    absl::StatusOr<TensorMap> out = backend->Run(req);
    ASSERT_TRUE(out.ok()) << out.status();
    const Vec x = req.in("x").ToFloat(), w = req.in("weight").ToFloat(), b = req.in("bias").ToFloat();
    Vec y = Poisoned(3 * 17);
    cpu::Linear(x.data(), w.data(), b.data(), 3, 33, 17, ParseActivation(act), y.data());
    EXPECT_EQ(out->at("y").ToFloat(), y);
  }
  // gelu tanh vs none differ.
  OpRequest g = MakeRandomRequest("gelu", DType::kF32, {3, 33}, 42);
  absl::StatusOr<TensorMap> erf_out = backend->Run(g);
  g.attrs["approximate"] = std::string("tanh");
  absl::StatusOr<TensorMap> tanh_out = backend->Run(g);
  ASSERT_TRUE(erf_out.ok() && tanh_out.ok());
  EXPECT_NE(erf_out->at("y").data, tanh_out->at("y").data);
}

}  // namespace
}  // namespace fusedserve
