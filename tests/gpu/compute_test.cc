// The compute-bound CUDA ops' edge cases beyond shapes against the CPU
// reference (kernels/cpu/reference.h): linear's epilogues and dtypes,
// attention's tile edges, long and varlen sequences, later chunks (queries
// after k_starts keys, the Hopper kernel's launch), decode's mixed lengths.
// Every op's shapes x dtypes x configs: op_test.cc.
//
// Each case draws fresh random inputs, uploads them, poisons the outputs with
// 0xFF bytes (NaN in every float dtype) so an unwritten element fails, runs
// RunCudaOp with each named config, and compares:
//   linear, swiglu_mlp: ||got - ref|| / ||ref|| under a dtype-scaled bound;
//   attention: max |got - ref| at most twice the error of a same-precision
//     reference (scores, probabilities and output rounded to the dtype, as a
//     plain bf16/fp16 framework computation would), the flash-attention rule.
// Skips without a GPU (CI has none).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/reference.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_hopper.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/linear.h"
#include "kernels/op.h"
#include "tests/gpu/device_upload.h"
#include "tests/gpu/poisoned_scratch.h"

namespace fusedserve {
namespace {

using Vec = std::vector<float>;

// ---- host helpers -------------------------------------------------------------

void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += workers) fn(i);
    });
  }
  for (auto& t : threads) t.join();
}

HostTensor RandomTensor(DType dt, std::vector<int64_t> shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return HostTensor::FromFloat(dt, std::move(shape), v);
}

HostTensor Ints(const std::vector<int64_t>& v) {
  return HostTensor::FromInt64(DType::kI64, {static_cast<int64_t>(v.size())}, v);
}

float Round(DType dt, float x) {
  if (dt == DType::kBF16) return Bf16ToFloat(FloatToBf16(x));
  if (dt == DType::kF16) return HalfToFloat(FloatToHalf(x));
  return x;
}

double RelL2(const Vec& got, const Vec& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double MaxAbs(const Vec& got, const Vec& ref) {
  double m = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(d <= m)) m = d;  // NaN propagates as NaN
    if (std::isnan(d)) return d;
  }
  return m;
}

int64_t CountNonFinite(const Vec& v) {
  int64_t n = 0;
  for (float x : v) n += std::isfinite(x) ? 0 : 1;
  return n;
}

// ---- device runner ------------------------------------------------------------

// Runs `r` on device 0 with `config` (empty: defaults); returns outputs as fp32.
std::map<std::string, Vec> RunOnGpu(const OpRequest& r, const std::string& config) {
  std::vector<void*> allocations;
  DeviceTensorMap in, out;
  for (const auto& entry : r.inputs) {
    const std::string& name = entry.first;
    DeviceTensor t = DeviceInput(r, name);
    std::string bytes(t.numel() * DTypeSize(t.dtype), '\0');
    WriteDeviceInput(r, name, bytes.data());
    EXPECT_EQ(cudaMalloc(&t.data, std::max<size_t>(bytes.size(), 16)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(t.data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    allocations.push_back(t.data);
    in[name] = t;
  }
  const DType dt = RequestDType(r);
  for (const auto& [name, shape] : OutputShapes(r)) {
    DeviceTensor t{dt, shape, nullptr};
    const size_t bytes = t.numel() * DTypeSize(dt);
    EXPECT_EQ(cudaMalloc(&t.data, std::max<size_t>(bytes, 16)), cudaSuccess);
    EXPECT_EQ(cudaMemset(t.data, 0xFF, bytes), cudaSuccess);
    allocations.push_back(t.data);
    out[name] = t;
  }
  PoisonedScratch scratch;
  DispatchContext ctx;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  ctx.sm_count = prop.multiProcessorCount;
  ctx.scratch = &scratch;
  if (!config.empty()) {
    ctx.config = [config](const std::string&, DType, const std::vector<int64_t>&) { return config; };
  }
  bool handled = false;
  const CudaStatus st = RunCudaOp(r, in, out, ctx, &handled);
  EXPECT_TRUE(handled) << r.op;
  EXPECT_TRUE(st.ok()) << r.op << " [" << config << "]: " << st.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  std::map<std::string, Vec> result;
  for (const auto& [name, t] : out) {
    HostTensor h;
    h.dtype = t.dtype;
    h.shape = t.shape;
    h.data.resize(t.numel() * DTypeSize(t.dtype));
    EXPECT_EQ(cudaMemcpy(h.data.data(), t.data, h.data.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    result[name] = h.ToFloat();
  }
  for (void* p : allocations) cudaFree(p);
  return result;
}

class ComputeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// ---- linear / swiglu_mlp -------------------------------------------------------

// Relative L2 error bounds: bf16/fp16 outputs are rounded (2^-9 / 2^-12
// relative), fp32 accumulation order differs from the reference.
double GemmTol(DType dt) { return dt == DType::kBF16 ? 1e-2 : (dt == DType::kF16 ? 2e-3 : 5e-5); }

OpRequest LinearRequest(DType dt, int64_t M, int64_t N, int64_t K, const std::string& act, bool bias, uint64_t seed) {
  OpRequest r = MakeRandomRequest("linear", dt, {M, N, K}, seed);
  r.attrs["activation"] = act;
  if (bias) r.inputs["bias"] = RandomTensor(dt, {N}, seed + 7);
  return r;
}

void CheckLinear(const OpRequest& r, const std::vector<std::string>& configs) {
  const HostTensor& x = r.in("x");
  const HostTensor& w = r.in("weight");
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  Vec bias;
  if (r.has("bias")) bias = r.in("bias").ToFloat();
  Vec ref(M * N);
  cpu::Linear(x.ToFloat().data(), w.ToFloat().data(), bias.empty() ? nullptr : bias.data(), M, K, N,
              ParseActivation(r.s("activation")), ref.data());
  const DType dt = x.dtype;
  for (const std::string& config : configs) {
    const Vec got = RunOnGpu(r, config)["y"];
    SCOPED_TRACE(std::string(DTypeName(dt)) + " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                 " K=" + std::to_string(K) + " act=" + r.s("activation") + (bias.empty() ? "" : " +bias") +
                 " config=[" + config + "]");
    EXPECT_EQ(CountNonFinite(got), 0);
    EXPECT_LT(RelL2(got, ref), GemmTol(dt));
  }
}

TEST_F(ComputeTest, LinearEpilogues) {
  uint64_t seed = 200;
  for (const char* act : {"none", "gelu", "gelu_tanh", "silu"}) {
    for (bool bias : {false, true}) {
      CheckLinear(LinearRequest(DType::kBF16, 17, 1001, 520, act, bias, ++seed), {"", "p0.a1"});
      CheckLinear(LinearRequest(DType::kBF16, 3, 1001, 520, act, bias, ++seed), {"p1.a0", "p0.a0", "p2.a0"});
    }
  }
}

// y = x . w^T (+ bias) + residual on cuBLASLt (GemmParams::residual, the
// model runner's o_proj and down): every path LaunchLinear is asked for runs
// the GEMM, y poisoned first, the residual left untouched; an activation
// with a residual is refused.
TEST_F(ComputeTest, LinearAddsTheResidual) {
  uint64_t seed = 400;
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (bool bias : {false, true}) {
      const int64_t M = 133, N = 520, K = 384;
      const OpRequest r = LinearRequest(dt, M, N, K, "none", bias, ++seed);
      const HostTensor res = RandomTensor(dt, {M, N}, ++seed);
      Vec bias_f;
      if (bias) bias_f = r.in("bias").ToFloat();
      Vec ref(M * N);
      cpu::Linear(r.in("x").ToFloat().data(), r.in("weight").ToFloat().data(), bias ? bias_f.data() : nullptr, M, K, N,
                  Activation::kNone, ref.data());
      const Vec rf = res.ToFloat();
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += rf[i];
      std::vector<void*> allocs;
      auto upload = [&](const std::string& bytes) { return UploadBytes(bytes, &allocs); };
      cuda::GemmParams g;
      g.dtype = dt;
      g.M = M;
      g.N = N;
      g.K = K;
      g.x = upload(r.in("x").data);
      g.w = upload(r.in("weight").data);
      g.bias = bias ? upload(r.in("bias").data) : nullptr;
      g.residual = upload(res.data);
      g.y = upload(std::string(res.data.size(), '\xFF'));
      for (const char* config : {"", "p0.a1", "p1.a0", "p2.a0"}) {
        SCOPED_TRACE(std::string(DTypeName(dt)) + (bias ? " +bias" : "") + " config=[" + config + "]");
        ASSERT_EQ(cudaMemset(g.y, 0xFF, res.data.size()), cudaSuccess);
        cuda::LinearConfig c;
        cuda::ParseLinearConfig(config, &c);
        const CudaStatus st = cuda::LaunchLinear(g, c, nullptr);
        ASSERT_TRUE(st.ok()) << st.message;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        HostTensor got;
        got.dtype = dt;
        got.shape = {M, N};
        got.data.resize(res.data.size());
        ASSERT_EQ(cudaMemcpy(got.data.data(), g.y, got.data.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        const Vec gf = got.ToFloat();
        EXPECT_EQ(CountNonFinite(gf), 0);
        EXPECT_LT(RelL2(gf, ref), GemmTol(dt));
        std::string res_after(res.data.size(), '\0');
        ASSERT_EQ(cudaMemcpy(res_after.data(), g.residual, res_after.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(res_after, res.data) << "the residual was written";
      }
      g.act = Activation::kGeluErf;
      EXPECT_FALSE(cuda::LaunchLinear(g, cuda::LinearConfig{}, nullptr).ok());
      for (void* p : allocs) cudaFree(p);
    }
  }
}

TEST_F(ComputeTest, LinearOtherDtypes) {
  CheckLinear(LinearRequest(DType::kF16, 1000, 256, 512, "gelu_tanh", true, 301), {"", "p0.a2"});
  CheckLinear(LinearRequest(DType::kF16, 2, 1001, 520, "silu", true, 302), {"", "p1.a0", "p0.a0"});
  CheckLinear(LinearRequest(DType::kF32, 17, 1001, 520, "gelu", true, 303), {"", "p0.a0"});
  CheckLinear(LinearRequest(DType::kF32, 3, 300, 516, "gelu_tanh", false, 304), {"p1.a0", "p0.a0"});
  CheckLinear(LinearRequest(DType::kF32, 5, 77, 31, "none", true, 305), {""});
}

// ---- attention -----------------------------------------------------------------

// Same-precision reference for one query head against keys [0, n) of a
// [rows, H*D] K/V slab: scores, probabilities and output rounded to dt.
void SamePrecisionOne(DType dt, const float* q, const float* k, const float* v, int64_t n, int64_t stride, int64_t D,
                      float scale, float* o) {
  std::vector<float> s(std::max<int64_t>(n, 1));
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    float d = 0.0f;
    for (int64_t e = 0; e < D; ++e) d += q[e] * k[j * stride + e];
    s[j] = Round(dt, d * scale);
    mx = std::max(mx, s[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  std::vector<float> acc(D, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float p = Round(dt, s[j] / sum);
    for (int64_t e = 0; e < D; ++e) acc[e] += p * v[j * stride + e];
  }
  for (int64_t e = 0; e < D; ++e) o[e] = Round(dt, acc[e]);
}

// The attention tolerance rule: max error at most twice the same-precision
// reference's, plus a floor for fp32 where that reference is exact.
void ExpectAttentionClose(DType dt, const Vec& got, const Vec& sp, const Vec& ref, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(CountNonFinite(got), 0);
  const double err = MaxAbs(got, ref), err_sp = MaxAbs(sp, ref);
  const double floor = dt == DType::kF32 ? 2e-5 : 1e-4;
  EXPECT_LE(err, 2.0 * err_sp + floor) << "err=" << err << " same-precision err=" << err_sp;
  EXPECT_LT(RelL2(got, ref), dt == DType::kF32 ? 1e-5 : 1.5e-2);
}

struct PrefillCase {
  DType dt;
  std::vector<int64_t> seq_lens;
  int64_t Hq, Hkv, D;
  bool causal;
};

void CheckPrefill(const PrefillCase& c, uint64_t seed, const std::vector<std::string>& configs) {
  int64_t T = 0;
  for (int64_t l : c.seq_lens) T += l;
  OpRequest r;
  r.op = "attention";
  r.spec = FindOpSpec(r.op);
  r.inputs["q"] = RandomTensor(c.dt, {T, c.Hq, c.D}, seed);
  r.inputs["k"] = RandomTensor(c.dt, {T, c.Hkv, c.D}, seed + 1);
  r.inputs["v"] = RandomTensor(c.dt, {T, c.Hkv, c.D}, seed + 2);
  r.inputs["seq_lens"] = Ints(c.seq_lens);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  r.attrs["causal"] = c.causal;
  r.attrs["scale"] = static_cast<double>(scale);

  const Vec q = r.in("q").ToFloat(), k = r.in("k").ToFloat(), v = r.in("v").ToFloat();
  const int64_t D = c.D, Hq = c.Hq, Hkv = c.Hkv, group = Hq / Hkv, B = c.seq_lens.size();
  Vec ref(T * Hq * D), sp(T * Hq * D);
  // The oracle per head (threads), and the same-precision reference per row.
  ParallelFor(Hq, [&](int64_t h) {
    const int64_t kvh = h / group;
    Vec qh(T * D), kh(T * D), vh(T * D), oh(T * D);
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(&q[(t * Hq + h) * D], D, &qh[t * D]);
      std::copy_n(&k[(t * Hkv + kvh) * D], D, &kh[t * D]);
      std::copy_n(&v[(t * Hkv + kvh) * D], D, &vh[t * D]);
    }
    cpu::Attention(qh.data(), kh.data(), vh.data(), c.seq_lens.data(), B, T, 1, 1, D, c.causal, scale, oh.data());
    for (int64_t t = 0; t < T; ++t) std::copy_n(&oh[t * D], D, &ref[(t * Hq + h) * D]);
  });
  std::vector<int64_t> start(T), len(T);
  for (int64_t b = 0, off = 0; b < B; off += c.seq_lens[b++]) {
    for (int64_t i = 0; i < c.seq_lens[b]; ++i) {
      start[off + i] = off;
      len[off + i] = c.causal ? i + 1 : c.seq_lens[b];
    }
  }
  ParallelFor(T, [&](int64_t t) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / group;
      SamePrecisionOne(c.dt, &q[(t * Hq + h) * D], &k[(start[t] * Hkv + kvh) * D], &v[(start[t] * Hkv + kvh) * D],
                       len[t], Hkv * D, D, scale, &sp[(t * Hq + h) * D]);
    }
  });
  for (const std::string& config : configs) {
    std::string lens;
    for (int64_t l : c.seq_lens) lens += std::to_string(l) + ",";
    ExpectAttentionClose(c.dt, RunOnGpu(r, config)["o"], sp, ref,
                         std::string(DTypeName(c.dt)) + " seq_lens=" + lens + " Hq=" + std::to_string(Hq) +
                             " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
                             (c.causal ? " causal" : " full") + " config=[" + config + "]");
  }
}

TEST_F(ComputeTest, AttentionPrefillTileEdges) {
  uint64_t seed = 500;
  for (int64_t S : {1, 63, 65, 1000}) {
    for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}, {8, 1}}) {
      for (int64_t D : {64, 128}) {
        CheckPrefill({DType::kBF16, {S}, Hq, Hkv, D, true}, seed += 3, {"m128.w4", "m64.w4", "m128.w8"});
      }
    }
  }
}

TEST_F(ComputeTest, AttentionPrefillLong) {
  CheckPrefill({DType::kBF16, {4097}, 4, 1, 128, true}, 600, {"m128.w4", "m64.w4", "m128.w8"});
  CheckPrefill({DType::kF16, {4097}, 2, 1, 64, true}, 603, {""});
}

TEST_F(ComputeTest, AttentionPrefillVarlenAndFull) {
  CheckPrefill({DType::kBF16, {1, 63, 65, 1000, 130}, 8, 2, 128, true}, 700, {"", "m64.w4", "m128.w8"});
  CheckPrefill({DType::kBF16, {1, 63, 65, 1000, 130}, 8, 2, 128, false}, 703, {"", "m64.w4", "m128.w8"});
  CheckPrefill({DType::kF16, {65, 200}, 4, 4, 64, false}, 706, {""});
  CheckPrefill({DType::kF16, {129, 7}, 8, 8, 128, true}, 709, {"m128.w4"});
}

// The Hopper wgmma + TMA kernel (h128.*; "" is it on compute capability 9.0,
// and on other GPUs these configs run the mma.sync kernel): 128-row query
// tiles and 128-key tiles, so the edges are at 64 (a consumer warpgroup's
// rows) and 128; GQA 1/4/8, both head dims and dtypes, causal and not.
// Every built variant by its full name: a name that does not parse runs the
// default config (HopperConfigNamesParse; the short names this list held
// before never ran anything but the default).
const std::vector<std::string> kHopperConfigs = {"",
                                                 "h128.s2.o2.e1",
                                                 "h128.s2.o2.e0",
                                                 "h128.s2.o1.e1",
                                                 "h128.s2.o1.e0",
                                                 "h128.s3.o1.e1",
                                                 "h128.s2.o0.e1",
                                                 "h128.s2.o1.e1.q2",
                                                 "h128.s2.o2.e1.q2"};

TEST_F(ComputeTest, HopperConfigNamesParse) {
  for (const std::string& name : kHopperConfigs) {
    if (name.empty()) continue;
    cuda::AttentionConfig c;
    EXPECT_TRUE(cuda::ParseAttentionConfig(name, &c)) << name;
    EXPECT_EQ(cuda::FormatAttentionConfig(c), name);
  }
  // One Q buffer has only the four-field name; two are built for s2 o1/o2 e1.
  for (const char* name : {"h128.s2.o1.e1.q1", "h128.s2.o0.e1.q2", "h128.s3.o1.e1.q2", "h128.s2.o1.e0.q2"}) {
    cuda::AttentionConfig c;
    EXPECT_FALSE(cuda::ParseAttentionConfig(name, &c)) << name;
  }
}

TEST_F(ComputeTest, AttentionPrefillHopperTileEdges) {
  uint64_t seed = 900;
  int n = 0;
  for (int64_t S : {1, 63, 64, 65, 127, 129, 1000}) {
    for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {8, 2}, {8, 1}}) {
      for (int64_t D : {64, 128}) {
        for (bool causal : {true, false}) {
          const DType dt = (n++ % 2 == 0) ? DType::kBF16 : DType::kF16;
          CheckPrefill({dt, {S}, Hq, Hkv, D, causal}, seed += 3, kHopperConfigs);
        }
      }
    }
  }
}

TEST_F(ComputeTest, AttentionPrefillHopperLong) {
  CheckPrefill({DType::kBF16, {4097}, 4, 1, 128, true}, 950, kHopperConfigs);
  CheckPrefill({DType::kF16, {4097}, 8, 1, 64, false}, 953, kHopperConfigs);
}

TEST_F(ComputeTest, AttentionPrefillHopperVarlen) {
  const std::vector<int64_t> mix = {1, 63, 64, 65, 127, 1000, 130};
  CheckPrefill({DType::kBF16, mix, 8, 2, 128, true}, 960, kHopperConfigs);
  CheckPrefill({DType::kBF16, mix, 8, 2, 128, false}, 963, kHopperConfigs);
  CheckPrefill({DType::kF16, mix, 8, 1, 64, true}, 966, kHopperConfigs);
  CheckPrefill({DType::kF16, mix, 4, 4, 64, false}, 969, kHopperConfigs);
  CheckPrefill({DType::kBF16, {4097, 65, 1, 64}, 4, 1, 128, true}, 972, kHopperConfigs);
  // Sixteen waves of tiles on 132 SMs, nearly half of them past their sequence
  // (the persistent CTAs' tile order skips those), each config after the
  // other on one stream.
  CheckPrefill({DType::kBF16, {2048, 1500, 700, 64}, 32, 8, 128, true}, 975,
               {"", "h128.s2.o1.e1.q2", "h128.s2.o0.e1", "h128.s2.o2.e1"});
  // The same at head dim 64 (its default is the in-order schedule, which
  // takes the next tile at a different point of the tile).
  CheckPrefill({DType::kF16, {2048, 1500, 700, 64}, 32, 8, 64, true}, 978, {"", "h128.s2.o1.e1.q2", "h128.s2.o0.e1"});
}

// ---- attention of later chunks (AttentionParams::k_starts) ---------------------

struct ChunkCase {
  DType dt;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // {k_start, q_len}
  int64_t Hq, Hkv, D;
  bool causal;
};

// Sequence b's q_len queries are the last rows of k_start + q_len keys: the
// reference runs attention over all k_len rows (causal or not) and keeps the
// last q_len rows. LaunchAttentionPrefill is called directly (the attention
// op has no k_starts); the output is poisoned, the inputs fresh per case.
void CheckChunkPrefill(const ChunkCase& c, uint64_t seed, const std::vector<std::string>& configs) {
  const int64_t B = static_cast<int64_t>(c.seqs.size()), Hq = c.Hq, Hkv = c.Hkv, D = c.D, group = Hq / Hkv;
  std::vector<int64_t> k_lens(B), q_off(B), k_off(B);
  std::vector<int32_t> q_lens32(B), k_starts32(B);
  int64_t Tq = 0, Tk = 0, max_q = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto [ks, ql] = c.seqs[b];
    k_lens[b] = ks + ql;
    q_off[b] = Tq;
    k_off[b] = Tk;
    Tq += ql;
    Tk += ks + ql;
    max_q = std::max(max_q, ql);
    q_lens32[b] = static_cast<int32_t>(ql);
    k_starts32[b] = static_cast<int32_t>(ks);
  }
  // Full-length q/k/v over the k_len rows of each sequence, rounded to dt.
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    Vec v(n);
    for (float& x : v) x = Round(c.dt, dist(rng));
    return v;
  };
  const Vec qf = random(Tk * Hq * D), k = random(Tk * Hkv * D), v = random(Tk * Hkv * D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Vec ref(Tq * Hq * D), sp(Tq * Hq * D), q(Tq * Hq * D);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ks = c.seqs[b].first, ql = c.seqs[b].second;
    std::copy_n(&qf[(k_off[b] + ks) * Hq * D], ql * Hq * D, &q[q_off[b] * Hq * D]);
  }
  ParallelFor(Hq, [&](int64_t h) {
    const int64_t kvh = h / group;
    Vec qh(Tk * D), kh(Tk * D), vh(Tk * D), oh(Tk * D);
    for (int64_t t = 0; t < Tk; ++t) {
      std::copy_n(&qf[(t * Hq + h) * D], D, &qh[t * D]);
      std::copy_n(&k[(t * Hkv + kvh) * D], D, &kh[t * D]);
      std::copy_n(&v[(t * Hkv + kvh) * D], D, &vh[t * D]);
    }
    cpu::Attention(qh.data(), kh.data(), vh.data(), k_lens.data(), B, Tk, 1, 1, D, c.causal, scale, oh.data());
    for (int64_t b = 0; b < B; ++b) {
      const int64_t ks = c.seqs[b].first, ql = c.seqs[b].second;
      for (int64_t i = 0; i < ql; ++i) {
        std::copy_n(&oh[(k_off[b] + ks + i) * D], D, &ref[((q_off[b] + i) * Hq + h) * D]);
        SamePrecisionOne(c.dt, &q[((q_off[b] + i) * Hq + h) * D], &k[(k_off[b] * Hkv + kvh) * D],
                         &v[(k_off[b] * Hkv + kvh) * D], c.causal ? ks + i + 1 : k_lens[b], Hkv * D, D, scale,
                         &sp[((q_off[b] + i) * Hq + h) * D]);
      }
    }
  });

  auto bits = [&](const Vec& x) {
    std::vector<uint16_t> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = c.dt == DType::kBF16 ? FloatToBf16(x[i]) : FloatToHalf(x[i]);
    return out;
  };
  const std::vector<uint16_t> qb = bits(q), kb = bits(k), vb = bits(v);
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr, *dlens = nullptr, *dstarts = nullptr;
  ASSERT_EQ(cudaMalloc(&dq, qb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dk, kb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dv, vb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dout, qb.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dlens, B * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dstarts, B * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dq, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dk, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dv, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dlens, q_lens32.data(), B * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dstarts, k_starts32.data(), B * 4, cudaMemcpyHostToDevice), cudaSuccess);
  cuda::AttentionParams a;
  a.dtype = c.dt;
  a.q = dq;
  a.k = dk;
  a.v = dv;
  a.o = dout;
  a.seq_lens = static_cast<const int32_t*>(dlens);
  a.k_starts = static_cast<const int32_t*>(dstarts);
  a.B = static_cast<int>(B);
  a.T = static_cast<int>(Tq);
  a.Tk = static_cast<int>(Tk);
  a.max_seqlen = static_cast<int>(max_q);
  a.Hq = static_cast<int>(Hq);
  a.Hkv = static_cast<int>(Hkv);
  a.D = static_cast<int>(D);
  a.causal = c.causal;
  a.scale = scale;
  std::string what = std::string(DTypeName(c.dt)) + " {k_start,q_len}=";
  for (const auto& [ks, ql] : c.seqs) what += "{" + std::to_string(ks) + "," + std::to_string(ql) + "}";
  what += " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
          (c.causal ? " causal" : " full");
  for (const std::string& config : configs) {
    cuda::AttentionConfig ac;
    if (!cuda::ParseAttentionConfig(config, &ac)) ac = cuda::DefaultAttentionConfig(a, 132);
    ASSERT_EQ(cudaMemset(dout, 0xFF, qb.size() * 2), cudaSuccess);
    const CudaStatus st = cuda::LaunchAttentionPrefill(a, ac, nullptr);
    ASSERT_TRUE(st.ok()) << st.message << " " << what << " config=[" << config << "]";
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> ob(qb.size());
    ASSERT_EQ(cudaMemcpy(ob.data(), dout, ob.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    Vec got(ob.size());
    for (size_t i = 0; i < ob.size(); ++i) got[i] = c.dt == DType::kBF16 ? Bf16ToFloat(ob[i]) : HalfToFloat(ob[i]);
    ExpectAttentionClose(c.dt, got, sp, ref, what + " config=[" + config + "]");
  }
  // The mma.sync kernel has no k_starts: refused, so callers fall back.
  cuda::AttentionConfig mma;
  ASSERT_TRUE(cuda::ParseAttentionConfig("m128.w4", &mma));
  EXPECT_TRUE(cuda::LaunchAttentionPrefill(a, mma, nullptr).unsupported);
  for (void* p : {dq, dk, dv, dout, dlens, dstarts}) cudaFree(p);
}

// Every {k_start, q_len} of {0, 1, 15, 64, 100, 1000} x {1, 16, 63, 64, 65,
// 300} once, three per varlen batch in a shuffled order; GQA 1/4/8, head
// dims 64/128, bf16/fp16, causal and not; then the model's prefix-cache shape.
TEST_F(ComputeTest, AttentionPrefillHopperChunks) {
  if (!cuda::HopperAttentionAvailable()) GTEST_SKIP() << "the Hopper attention kernel needs compute capability 9.0";
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t ks : {0, 1, 15, 64, 100, 1000}) {
    for (int64_t ql : {1, 16, 63, 64, 65, 300}) pairs.push_back({ks, ql});
  }
  std::mt19937 rng(77);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  const std::pair<int64_t, int64_t> gqa[] = {{2, 2}, {8, 2}, {8, 1}};
  uint64_t seed = 1100;
  for (int i = 0; i < 12; ++i) {
    ChunkCase c{i % 2 == 0 ? DType::kBF16 : DType::kF16,
                {pairs[3 * i], pairs[3 * i + 1], pairs[3 * i + 2]},
                gqa[i % 3].first,
                gqa[i % 3].second,
                (i / 3) % 2 == 0 ? 64 : 128,
                (i / 2) % 2 == 0};
    CheckChunkPrefill(c, seed += 3, kHopperConfigs);
  }
  CheckChunkPrefill({DType::kBF16, {{128, 1920}}, 8, 2, 64, true}, 1200, {""});
  CheckChunkPrefill({DType::kF16, {{1000, 300}, {0, 65}, {15, 1}}, 8, 1, 128, false}, 1203, {"", "h128.s3.o1.e1"});
  // Several waves of tiles (the persistent CTAs' tile scheduler at work), at
  // both head dims.
  CheckChunkPrefill({DType::kBF16, {{128, 1920}, {1000, 700}, {0, 1024}}, 16, 4, 128, true}, 1206,
                    {"", "h128.s2.o1.e1.q2", "h128.s2.o0.e1"});
  CheckChunkPrefill({DType::kF16, {{128, 1920}, {1000, 700}, {0, 1024}}, 16, 4, 64, true}, 1209, {"", "h128.s2.o2.e1"});
}

TEST_F(ComputeTest, AttentionPrefillFp32) {
  CheckPrefill({DType::kF32, {63, 65}, 4, 1, 64, true}, 800, {""});
  CheckPrefill({DType::kF32, {1, 100}, 8, 2, 128, false}, 803, {""});
}

struct DecodeCase {
  DType dt;
  std::vector<int64_t> lengths;
  int64_t L, Hq, Hkv, D;
};

void CheckDecode(const DecodeCase& c, uint64_t seed, const std::vector<std::string>& configs) {
  const int64_t B = c.lengths.size(), L = c.L, Hq = c.Hq, Hkv = c.Hkv, D = c.D, group = Hq / Hkv;
  OpRequest r;
  r.op = "attention_decode";
  r.spec = FindOpSpec(r.op);
  r.inputs["q"] = RandomTensor(c.dt, {B, Hq, D}, seed);
  r.inputs["k_cache"] = RandomTensor(c.dt, {B, L, Hkv, D}, seed + 1);
  r.inputs["v_cache"] = RandomTensor(c.dt, {B, L, Hkv, D}, seed + 2);
  r.inputs["lengths"] = Ints(c.lengths);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  r.attrs["scale"] = static_cast<double>(scale);
  const Vec q = r.in("q").ToFloat(), k = r.in("k_cache").ToFloat(), v = r.in("v_cache").ToFloat();
  Vec ref(B * Hq * D), sp(B * Hq * D);
  cpu::AttentionDecode(q.data(), k.data(), v.data(), c.lengths.data(), B, L, Hq, Hkv, D, scale, ref.data());
  ParallelFor(B * Hq, [&](int64_t i) {
    const int64_t b = i / Hq, h = i % Hq, kvh = h / group;
    SamePrecisionOne(c.dt, &q[i * D], &k[(b * L * Hkv + kvh) * D], &v[(b * L * Hkv + kvh) * D], c.lengths[b], Hkv * D,
                     D, scale, &sp[i * D]);
  });
  for (const std::string& config : configs) {
    std::string lens;
    for (int64_t l : c.lengths) lens += std::to_string(l) + ",";
    ExpectAttentionClose(c.dt, RunOnGpu(r, config)["o"], sp, ref,
                         std::string(DTypeName(c.dt)) + " lengths=" + lens + " L=" + std::to_string(L) +
                             " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
                             " config=[" + config + "]");
  }
}

TEST_F(ComputeTest, AttentionDecodeMixedLengths) {
  CheckDecode({DType::kBF16, {1, 17, 1000, 4097, 2500}, 4097, 8, 1, 128}, 900, {"", "s1", "s7", "s64"});
  CheckDecode({DType::kBF16, {64, 65, 300}, 300, 8, 2, 64}, 903, {"", "s1", "s3"});
  CheckDecode({DType::kF16, {63, 1, 129}, 129, 4, 4, 128}, 906, {"", "s2"});
  CheckDecode({DType::kF32, {100, 37}, 128, 8, 2, 128}, 909, {"", "s4"});
  CheckDecode({DType::kF32, {5, 64}, 64, 3, 1, 64}, 912, {""});
}

TEST_F(ComputeTest, AttentionDecodeLongSingle) { CheckDecode({DType::kBF16, {16384}, 16384, 32, 8, 128}, 950, {""}); }

// ---- through the backend ---------------------------------------------------------

TEST_F(ComputeTest, BackendRunsComputeOps) {
  auto backend = MakeCudaBackend(0, nullptr);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto cpu = MakeCpuBackend();
  const OpRequest reqs[] = {
      MakeRandomRequest("linear", DType::kBF16, {5, 96, 64}, 1),
      MakeRandomRequest("swiglu_mlp", DType::kBF16, {9, 64, 160}, 2),
      MakeRandomRequest("attention", DType::kBF16, {70, 4, 2, 64}, 3),
      MakeRandomRequest("attention_decode", DType::kBF16, {2, 300, 4, 2, 128}, 4),
  };
  for (const OpRequest& r : reqs) {
    auto got = (*backend)->Run(r);
    auto want = cpu->Run(r);
    ASSERT_TRUE(got.ok()) << r.op << ": " << got.status();
    ASSERT_TRUE(want.ok()) << r.op << ": " << want.status();
    for (const auto& [name, t] : *want) {
      EXPECT_LT(RelL2(got->at(name).ToFloat(), t.ToFloat()), 1.5e-2) << r.op << " " << name;
    }
  }
}

}  // namespace
}  // namespace fusedserve
