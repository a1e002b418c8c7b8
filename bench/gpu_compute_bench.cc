// Benchmark of the compute-bound CUDA ops against ceilings measured in the
// same run: device-to-device copy bandwidth (bytes read + written) and a
// plain cuBLASLt bf16 GEMM (8192^3), plus a plain cuBLASLt call with the same
// epilogue for every linear case and the sum of the plain GEMMs for
// swiglu_mlp. Everything bf16, on device 0.
//
//   FLOPs: linear 2*M*N*K; swiglu_mlp 2*M*D*2I + 2*M*I*D;
//          causal attention 2*B*Hq*S^2*D (half of 4*B*Hq*S^2*D).
//   Bytes: each input read once, each output written once (decode: q, the
//          K/V rows within the lengths, o; swiglu M=1: the weights alone).
// Times are medians of per-launch event timings, after warm-up; input sets
// are rotated until one pass touches >= 256 MB so L2 does not flatter.
// Shapes: the model shapes of tests/gpu/op_cases.h (Llama-3-8B's dims).
// Usage:
//   gpu_compute_bench [out.json [linear|swiglu|prefill|prefill:B:S[:D]|decode|gemm_algos|decode_gemm|rope_kv|paged]]
// (gemm_algos: cuBLASLt's heuristic list on the large GEMMs, timed; decode_gemm:
// the 1B model's decode-step GEMMs at 16-64 rows in CUDA graphs; paged: the
// model's paged decode attention; none of them in the default run)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/predecessor.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/op.h"
#include "tests/gpu/op_cases.h"

namespace fusedserve {
namespace {

#define LT_CHECK(expr)                                                                                      \
  do {                                                                                                      \
    cublasStatus_t s_ = (expr);                                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                      \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #expr, __FILE__, __LINE__, cublasGetStatusName(s_)); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

constexpr size_t kRotateBytes = 256ull << 20;
constexpr int kIters = 30;

cudaStream_t g_stream;

// One random 64 MB source on the device; buffers are filled from it (random
// values in [-1, 1), never zeros, which run faster than real data).
void* g_random = nullptr;
constexpr size_t kRandomBytes = 64ull << 20;

// FS_BENCH_DATA=torch: values as torch.rand(dtype=bfloat16) * 2 - 1 makes
// them (multiples of 2^-7: few mantissa bits set). Tensor cores draw less
// power on such data and hold higher clocks, so a GEMM runs ~15% faster on
// it than on full-precision random values: compare peers on the same data.
void InitRandom() {
  const char* mode = std::getenv("FS_BENCH_DATA");
  const bool coarse = mode != nullptr && std::string(mode) == "torch";
  std::printf("input data: %s\n", coarse ? "torch.rand(bf16)*2-1 (multiples of 2^-7)" : "uniform [-1, 1), full bf16");
  std::vector<uint16_t> h(kRandomBytes / 2);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (auto& x : h) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    float f = static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
    if (coarse) f = std::floor((f + 1.0f) * 128.0f) / 128.0f - 1.0f;
    x = FloatToBf16(f);
  }
  BENCH_CHECK(cudaMalloc(&g_random, kRandomBytes));
  BENCH_CHECK(cudaMemcpy(g_random, h.data(), kRandomBytes, cudaMemcpyHostToDevice));
}

std::vector<void*> g_allocs;
void* Alloc(size_t bytes, bool fill = true) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  g_allocs.push_back(p);
  if (fill) {
    // Chunks of half the source, each from a different offset into it.
    const size_t chunk = kRandomBytes / 2;
    for (size_t off = 0; off < bytes; off += chunk) {
      const size_t n = std::min(chunk, bytes - off);
      const size_t src = (off / chunk * 4096) % chunk;
      BENCH_CHECK(
          cudaMemcpy(static_cast<char*>(p) + off, static_cast<char*>(g_random) + src, n, cudaMemcpyDeviceToDevice));
    }
  }
  return p;
}
void FreeAll() {
  for (void* p : g_allocs) cudaFree(p);
  g_allocs.clear();
}

int Copies(size_t set_bytes) {
  return static_cast<int>(std::clamp<size_t>((kRotateBytes + set_bytes - 1) / std::max<size_t>(set_bytes, 1), 1, 16));
}

// Median microseconds of each fns[j](i) over `iters` rounds; the functions
// run interleaved (round i runs every one of them), so clock and thermal drift
// during a case affect all of them alike. i is the round, for input rotation.
std::vector<double> TimeUs(const std::vector<std::function<void(int)>>& fns, int iters = kIters) {
  const size_t n = fns.size();
  for (int i = 0; i < 2; ++i) {
    for (auto& f : fns) f(i);
  }
  BENCH_CHECK(cudaStreamSynchronize(g_stream));
  std::vector<cudaEvent_t> ev(2 * iters * n);
  for (auto& e : ev) BENCH_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    for (size_t j = 0; j < n; ++j) {
      BENCH_CHECK(cudaEventRecord(ev[2 * (i * n + j)], g_stream));
      fns[j](i);
      BENCH_CHECK(cudaEventRecord(ev[2 * (i * n + j) + 1], g_stream));
    }
  }
  BENCH_CHECK(cudaStreamSynchronize(g_stream));
  BENCH_CHECK(cudaGetLastError());
  std::vector<double> med(n);
  for (size_t j = 0; j < n; ++j) {
    std::vector<double> t(iters);
    for (int i = 0; i < iters; ++i) {
      float ms = 0;
      BENCH_CHECK(cudaEventElapsedTime(&ms, ev[2 * (i * n + j)], ev[2 * (i * n + j) + 1]));
      t[i] = ms * 1e3;
    }
    std::sort(t.begin(), t.end());
    med[j] = t[iters / 2];
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return med;
}
double TimeUs(const std::function<void(int)>& fn, int iters = kIters) { return TimeUs(std::vector{fn}, iters)[0]; }

// Mean GPU time per launch of fn(0..n-1) issued back to back (no host gap
// between launches; how docs/peers.md times the peers' short kernels, which
// per-launch events would charge with their host overhead): median of 5.
double BackToBackUs(const std::function<void(int)>& fn, int n) {
  fn(0);
  BENCH_CHECK(cudaStreamSynchronize(g_stream));
  std::vector<double> us;
  for (int r = 0; r < 5; ++r) {
    us.push_back(bench::EventUs(g_stream,
                                [&] {
                                  for (int i = 0; i < n; ++i) fn(i);
                                }) /
                 n);
  }
  return bench::Median(us);
}

// Mean GPU time per launch of fn(0..n-1) captured into one CUDA graph (as
// the model's decode step runs its kernels, programmatic dependent launches
// included): median of 7 replays.
double GraphUs(const std::function<void(int)>& fn, int n) {
  fn(0);  // lazy set-up (cuBLASLt heuristics, attributes) outside the capture
  BENCH_CHECK(cudaStreamSynchronize(g_stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < n; ++i) fn(i);
  BENCH_CHECK(cudaStreamEndCapture(g_stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = bench::GraphReplayUs(g_stream, exec, n, 7);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

// ---- plain cuBLASLt, written independently of kernels/cuda/gemm.cc ----------
class PlainLt {
 public:
  PlainLt() {
    LT_CHECK(cublasLtCreate(&handle_));
    BENCH_CHECK(cudaMalloc(&ws_, kWs));
  }
  // y[M,N] = epi(x[M,K] w[N,K]^T (+bias)), bf16, heuristic's first algorithm.
  void Gemm(int64_t M, int64_t N, int64_t K, const void* x, const void* w, const void* bias, void* y,
            cublasLtEpilogue_t epi) {
    cublasLtMatmulDesc_t desc;
    LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (bias) LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    cublasLtMatrixLayout_t a, b, d;
    LT_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&d, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWs;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc, a, b, d, d, pref, 1, &heur, &found));
    if (found == 0) {
      std::fprintf(stderr, "plain cuBLASLt: no algorithm\n");
      std::exit(1);
    }
    const float alpha = 1.0f, beta = 0.0f;
    LT_CHECK(cublasLtMatmul(handle_, desc, &alpha, w, a, x, b, &beta, y, d, y, d, &heur.algo, ws_, kWs, g_stream));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(desc);
  }

 private:
  static constexpr size_t kWs = 32u << 20;
  cublasLtHandle_t handle_;
  void* ws_;
};

// ---- running our ops ----------------------------------------------------------
class BenchScratch : public Scratch {
 public:
  CudaStatus Get(size_t bytes, void** ptr) override {
    if (bytes > size_) {
      if (ptr_) cudaFree(ptr_);
      BENCH_CHECK(cudaMalloc(&ptr_, bytes));
      size_ = bytes;
    }
    *ptr = ptr_;
    return CudaStatus::Ok();
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};
BenchScratch g_scratch;
int g_sm_count = 0;

void RunOp(const OpRequest& host, const DeviceTensorMap& in, const DeviceTensorMap& out, const std::string& config) {
  DispatchContext ctx;
  ctx.stream = g_stream;
  ctx.sm_count = g_sm_count;
  ctx.scratch = &g_scratch;
  if (!config.empty()) {
    ctx.config = [config](const std::string&, DType, const std::vector<int64_t>&) { return config; };
  }
  bool handled = false;
  const CudaStatus s = RunCudaOp(host, in, out, ctx, &handled);
  if (!handled || !s.ok()) {
    std::fprintf(stderr, "%s [%s] failed: %s\n", host.op.c_str(), config.c_str(), s.message.c_str());
    std::exit(1);
  }
}

HostTensor Shape(std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = DType::kBF16;
  t.shape = std::move(shape);
  return t;  // no data: dispatch reads shapes from the device tensors
}
DeviceTensor Dev(std::vector<int64_t> shape, void* p, DType dt = DType::kBF16) { return {dt, std::move(shape), p}; }

// ---- results -------------------------------------------------------------------
nlohmann::json g_rows = nlohmann::json::array();
struct Row {
  std::string section, op, shape, impl;
  double us, rate;
  std::string unit;
  double pct;      // % of the matching ceiling
  std::string vs;  // comparison text
};
std::vector<Row> g_table;
void Add(const Row& r, nlohmann::json extra = nlohmann::json::object()) {
  g_table.push_back(r);
  nlohmann::json j = {
      {"section", r.section}, {"op", r.op},     {"shape", r.shape},        {"impl", r.impl}, {"us", r.us},
      {"rate", r.rate},       {"unit", r.unit}, {"pct_of_ceiling", r.pct}, {"vs", r.vs}};
  for (auto& [k, v] : extra.items()) j[k] = v;
  g_rows.push_back(j);
  std::printf("  %-12s %-34s %-30s %10.2f us %9.1f %-7s %5.1f%%  %s\n", r.op.c_str(), r.shape.c_str(), r.impl.c_str(),
              r.us, r.rate, r.unit.c_str(), r.pct, r.vs.c_str());
  std::fflush(stdout);
}
std::string Fmt(const char* f, double a) {
  char b[128];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

double g_copy_gbs = 0, g_gemm_tflops = 0;

void Ceilings(PlainLt& lt) {
  g_copy_gbs = bench::CopyBandwidthGBs(g_stream);
  const double us = 2.0 * (1ull << 30) / (g_copy_gbs * 1e9) * 1e6;
  Add({"ceiling", "copy", "1 GiB D2D", "cudaMemcpyAsync", us, g_copy_gbs, "GB/s", 100.0, "read+write bytes"});
  const int64_t n = 8192;
  void* x = Alloc(n * n * 2);
  void* w = Alloc(n * n * 2);
  void* y = Alloc(n * n * 2, false);
  const double gus = TimeUs([&](int) { lt.Gemm(n, n, n, x, w, nullptr, y, CUBLASLT_EPILOGUE_DEFAULT); }, 20);
  g_gemm_tflops = 2.0 * n * n * n / (gus * 1e-6) / 1e12;
  Add({"ceiling", "gemm", "bf16 8192^3", "plain cuBLASLt", gus, g_gemm_tflops, "TFLOP/s", 100.0, ""});
  FreeAll();
}

// The dims of an op's model shape in tests/gpu/op_cases.h (the shapes the
// GPU op test checks); the token dim (and decode's L) come from the caller.
std::vector<int64_t> ModelKey(const std::string& op) {
  const std::optional<testing::OpCase> c = testing::ModelCase(op);
  if (!c) {
    std::fprintf(stderr, "no model shape for %s in tests/gpu/op_cases.h\n", op.c_str());
    std::exit(1);
  }
  return c->key;
}

void LinearGelu(PlainLt& lt, int64_t M, double peer_us) {
  const int64_t N = ModelKey("linear")[1], K = ModelKey("linear")[2];
  const size_t set = (M * K + N * K + N + M * N) * 2;
  const int copies = Copies(set);
  std::vector<void*> xs, ws, bs, ys;
  for (int c = 0; c < copies; ++c) {
    xs.push_back(Alloc(M * K * 2));
    ws.push_back(Alloc(N * K * 2));
    bs.push_back(Alloc(N * 2));
    ys.push_back(Alloc(M * N * 2, false));
  }
  OpRequest host;
  host.op = "linear";
  host.spec = FindOpSpec(host.op);
  host.inputs = {{"x", Shape({M, K})}, {"weight", Shape({N, K})}, {"bias", Shape({N})}};
  host.attrs = {{"activation", std::string("gelu_tanh")}};
  auto op = [&](const std::string& cfg) {
    return [&, cfg](int i) {
      const int c = i % copies;
      RunOp(host, {{"x", Dev({M, K}, xs[c])}, {"weight", Dev({N, K}, ws[c])}, {"bias", Dev({N}, bs[c])}},
            {{"y", Dev({M, N}, ys[c])}}, cfg);
    };
  };
  const std::vector<std::string> cands = CudaCandidates("linear", DType::kBF16, {M, N, K});
  std::vector<std::function<void(int)>> fns = {[&](int i) {
                                                 const int c = i % copies;
                                                 lt.Gemm(M, N, K, xs[c], ws[c], bs[c], ys[c],
                                                         CUBLASLT_EPILOGUE_GELU_BIAS);
                                               },
                                               op("")};
  for (const std::string& cfg : cands) fns.push_back(op(cfg));
  const std::vector<double> t = TimeUs(fns);
  const double base = t[0], ours = t[1];
  double best = ours;
  std::string best_cfg = "default";
  for (size_t j = 0; j < cands.size(); ++j) {
    if (t[2 + j] < best) best = t[2 + j], best_cfg = cands[j];
  }
  const double flops = 2.0 * M * N * K, bytes = static_cast<double>(set);
  const bool bw = M < 256;  // weight-streaming regime: report bandwidth
  const std::string shape = "M=" + std::to_string(M) + " K=4096 N=14336";
  auto rate = [&](double us) { return bw ? bytes / (us * 1e-6) / 1e9 : flops / (us * 1e-6) / 1e12; };
  auto pct = [&](double us) { return 100.0 * rate(us) / (bw ? g_copy_gbs : g_gemm_tflops); };
  const std::string unit = bw ? "GB/s" : "TFLOP/s";
  Add({"3", "linear+gelu", shape, "plain cuBLASLt GELU_BIAS", base, rate(base), unit, pct(base),
       Fmt("peer %.2f us", peer_us)});
  Add({"3", "linear+gelu", shape, "ours (default)", ours, rate(ours), unit, pct(ours),
       Fmt("%.3fx plain cuBLASLt", base / ours)},
      {{"ratio_vs_plain", base / ours}});
  Add({"3", "linear+gelu", shape, "ours (tuned " + best_cfg + ")", best, rate(best), unit, pct(best),
       Fmt("%.3fx plain cuBLASLt", base / best)},
      {{"ratio_vs_plain", base / best}, {"config", best_cfg}});
  FreeAll();
}

void SwigluMlp(PlainLt& lt, int64_t M, double peer_us) {
  const int64_t D = ModelKey("swiglu_mlp")[1], I = ModelKey("swiglu_mlp")[2];
  const size_t wbytes = (2 * I * D + D * I) * 2;
  const size_t set = wbytes + (M * D * 2) * 2;
  const int copies = Copies(set);
  std::vector<void*> xs, gus, downs, ys;
  for (int c = 0; c < copies; ++c) {
    xs.push_back(Alloc(M * D * 2));
    gus.push_back(Alloc(2 * I * D * 2));
    downs.push_back(Alloc(D * I * 2));
    ys.push_back(Alloc(M * D * 2, false));
  }
  void* inter = Alloc(M * 2 * I * 2, false);
  void* h = Alloc(M * I * 2);
  OpRequest host;
  host.op = "swiglu_mlp";
  host.spec = FindOpSpec(host.op);
  host.inputs = {{"x", Shape({M, D})}, {"gate_up", Shape({2 * I, D})}, {"down", Shape({D, I})}};
  auto op = [&](const std::string& cfg) {
    return [&, cfg](int i) {
      const int c = i % copies;
      RunOp(host, {{"x", Dev({M, D}, xs[c])}, {"gate_up", Dev({2 * I, D}, gus[c])}, {"down", Dev({D, I}, downs[c])}},
            {{"y", Dev({M, D}, ys[c])}}, cfg);
    };
  };
  // The ceiling for this op: its two plain GEMMs alone, back to back.
  const std::vector<std::string> cands = CudaCandidates("swiglu_mlp", DType::kBF16, {M, D, I});
  std::vector<std::function<void(int)>> fns = {
      [&](int i) {
        const int c = i % copies;
        lt.Gemm(M, 2 * I, D, xs[c], gus[c], nullptr, inter, CUBLASLT_EPILOGUE_DEFAULT);
        lt.Gemm(M, D, I, h, downs[c], nullptr, ys[c], CUBLASLT_EPILOGUE_DEFAULT);
      },
      op("")};
  for (const std::string& cfg : cands) fns.push_back(op(cfg));
  const std::vector<double> t = TimeUs(fns);
  const double gemms = t[0], ours = t[1];
  double best = ours;
  std::string best_cfg = "default";
  for (size_t j = 0; j < cands.size(); ++j) {
    if (t[2 + j] < best) best = t[2 + j], best_cfg = cands[j];
  }
  const double flops = 2.0 * M * D * 2 * I + 2.0 * M * I * D;
  const bool bw = M < 256;
  const std::string shape = "M=" + std::to_string(M) + " D=4096 I=14336";
  // Bandwidth counts the weights (the metric that matters at M=1) plus x and y.
  auto rate = [&](double us) { return bw ? static_cast<double>(set) / (us * 1e-6) / 1e9 : flops / (us * 1e-6) / 1e12; };
  auto pct = [&](double us) { return 100.0 * rate(us) / (bw ? g_copy_gbs : g_gemm_tflops); };
  const std::string unit = bw ? "GB/s" : "TFLOP/s";
  Add({"4", "swiglu_mlp", shape, "plain cuBLASLt 2 GEMMs alone", gemms, rate(gemms), unit, pct(gemms),
       Fmt("peer %.1f us", peer_us)});
  Add({"4", "swiglu_mlp", shape, "ours (default)", ours, rate(ours), unit, pct(ours),
       Fmt("%.3fx the GEMMs alone", gemms / ours)},
      {{"ratio_vs_gemms", gemms / ours}, {"weight_gbs", wbytes / (ours * 1e-6) / 1e9}});
  Add({"4", "swiglu_mlp", shape, "ours (tuned " + best_cfg + ")", best, rate(best), unit, pct(best),
       Fmt("%.3fx the GEMMs alone", gemms / best)},
      {{"ratio_vs_gemms", gemms / best}, {"config", best_cfg}, {"weight_gbs", wbytes / (best * 1e-6) / 1e9}});
  FreeAll();
}

// ---- cuBLASLt's heuristic list for one GEMM ------------------------------------
// Every algorithm cuBLASLt's heuristic offers (up to 16) at a few workspace
// caps, with its configuration and time, and the same back to back (the
// clock settles differently when nothing separates launches). Diagnoses how
// a plain first-choice call compares with the best algorithm on offer.
int AlgoAttr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t a) {
  int v = 0;
  size_t got = 0;
  uint32_t u = 0;
  if (a == CUBLASLT_ALGO_CONFIG_TILE_ID || a == CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME ||
      a == CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING || a == CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION ||
      a == CUBLASLT_ALGO_CONFIG_STAGES_ID || a == CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID ||
      a == CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) {
    uint16_t h = 0;
    if (a == CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME || a == CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING ||
        a == CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) {
      cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &u, sizeof(u), &got);
      return static_cast<int>(u);
    }
    cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &h, sizeof(h), &got);
    return h;
  }
  cublasLtMatmulAlgoConfigGetAttribute(&algo, a, &v, sizeof(v), &got);
  return v;
}

void GemmAlgos(int64_t M, int64_t N, int64_t K, cublasLtEpilogue_t epi) {
  std::printf("\ncuBLASLt heuristic algorithms, bf16 M=%ld N=%ld K=%ld epilogue %d (%.1f GFLOP)\n",
              static_cast<long>(M), static_cast<long>(N), static_cast<long>(K), static_cast<int>(epi),
              2.0 * M * N * K / 1e9);
  std::printf("cuBLASLt version %zu\n", cublasLtGetVersion());
  cublasLtHandle_t h;
  LT_CHECK(cublasLtCreate(&h));
  const size_t kMaxWs = 64u << 20;
  void* ws = Alloc(kMaxWs, false);
  void* x = Alloc(M * K * 2);
  void* w = Alloc(N * K * 2);
  void* b = Alloc(N * 2);
  void* y = Alloc(M * N * 2, false);
  cublasLtMatmulDesc_t desc;
  LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (epi == CUBLASLT_EPILOGUE_GELU_BIAS || epi == CUBLASLT_EPILOGUE_BIAS)
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)));
  cublasLtMatrixLayout_t la, lb, ld;
  LT_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
  LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, N, M, N));
  const float alpha = 1.0f, beta = 0.0f;
  for (size_t cap : {size_t{0}, size_t{1} << 20, size_t{4} << 20, size_t{32} << 20, kMaxWs}) {
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &cap, sizeof(cap)));
    std::vector<cublasLtMatmulHeuristicResult_t> r(16);
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 16, r.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    std::vector<std::function<void(int)>> fns;
    for (int i = 0; i < found; ++i) {
      fns.push_back([&, i, cap](int) {
        LT_CHECK(cublasLtMatmul(h, desc, &alpha, w, la, x, lb, &beta, y, ld, y, ld, &r[i].algo, ws, cap, g_stream));
      });
    }
    const std::vector<double> us = TimeUs(fns, 10);
    for (int i = 0; i < found; ++i) {
      // Back to back: 10 launches between two events.
      const double ms = bench::EventUs(g_stream,
                                       [&] {
                                         for (int k = 0; k < 10; ++k) fns[i](k);
                                       }) *
                        1e-3;
      const cublasLtMatmulAlgo_t& a = r[i].algo;
      std::printf(
          "  ws<=%2zu MiB #%-2d id %3d tile %3d stages %3d splitk %2d red %d swz %d cust %d inner %d cluster %2d "
          "ws %8zu waves %.2f | %8.2f us (%.0f TFLOP/s) b2b %8.2f us\n",
          cap >> 20, i, AlgoAttr(a, CUBLASLT_ALGO_CONFIG_ID), AlgoAttr(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
          AlgoAttr(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), AlgoAttr(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
          AlgoAttr(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), AlgoAttr(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
          AlgoAttr(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), AlgoAttr(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
          AlgoAttr(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), r[i].workspaceSize, r[i].wavesCount, us[i],
          2.0 * M * N * K / (us[i] * 1e-6) / 1e12, ms * 1e3 / 10);
    }
  }
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  FreeAll();
}

// head_dim 0: the model case's (tests/gpu/op_cases.h); 64: the 1B preset's.
void Prefill(int64_t B, int64_t S, double fa2_us, double cudnn_us, int64_t head_dim = 0) {
  const std::vector<int64_t> k = ModelKey("attention");
  const int64_t Hq = k[1], Hkv = k[2], D = head_dim > 0 ? head_dim : k[3], T = B * S;
  const size_t set = (2 * T * Hq * D + 2 * T * Hkv * D) * 2;
  const int copies = Copies(set);
  std::vector<void*> qs, ks, vs, os;
  for (int c = 0; c < copies; ++c) {
    qs.push_back(Alloc(T * Hq * D * 2));
    ks.push_back(Alloc(T * Hkv * D * 2));
    vs.push_back(Alloc(T * Hkv * D * 2));
    os.push_back(Alloc(T * Hq * D * 2, false));
  }
  std::vector<int64_t> lens(B, S);
  std::vector<int32_t> lens32(B, static_cast<int32_t>(S));
  void* dlens = Alloc(B * 4, false);
  BENCH_CHECK(cudaMemcpy(dlens, lens32.data(), B * 4, cudaMemcpyHostToDevice));
  OpRequest host;
  host.op = "attention";
  host.spec = FindOpSpec(host.op);
  host.inputs = {{"q", Shape({T, Hq, D})},
                 {"k", Shape({T, Hkv, D})},
                 {"v", Shape({T, Hkv, D})},
                 {"seq_lens", HostTensor::FromInt64(DType::kI64, {B}, lens)}};
  host.attrs = {{"causal", true}, {"scale", 1.0 / std::sqrt(static_cast<double>(D))}};
  auto op = [&](const std::string& cfg) {
    return [&, cfg](int i) {
      const int c = i % copies;
      RunOp(host,
            {{"q", Dev({T, Hq, D}, qs[c])},
             {"k", Dev({T, Hkv, D}, ks[c])},
             {"v", Dev({T, Hkv, D}, vs[c])},
             {"seq_lens", Dev({B}, dlens, DType::kI32)}},
            {{"o", Dev({T, Hq, D}, os[c])}}, cfg);
    };
  };
  const double flops = 2.0 * B * Hq * S * S * D;
  const std::string shape = "B=" + std::to_string(B) + " S=" + std::to_string(S) + " Hq=" + std::to_string(Hq) +
                            " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D);
  auto tf = [&](double us) { return flops / (us * 1e-6) / 1e12; };
  std::vector<std::string> cands = CudaCandidates("attention", DType::kBF16, {T, Hq, Hkv, D});
  // FS_PREFILL_CONFIGS=a,b,...: time only these configs beside the default
  // (names as the candidates list spells them), for shorter A/B runs.
  if (const char* only = std::getenv("FS_PREFILL_CONFIGS"); only != nullptr && *only != '\0') {
    const std::string keep = std::string(",") + only + ",";
    cands.erase(std::remove_if(cands.begin(), cands.end(),
                               [&](const std::string& c) { return keep.find("," + c + ",") == std::string::npos; }),
                cands.end());
  }
  std::vector<std::function<void(int)>> fns = {op("")};
  for (const std::string& cfg : cands) fns.push_back(op(cfg));
  std::vector<double> t = TimeUs(fns, S >= 8192 ? 10 : kIters);
  // Short kernels: per-launch events include the host's launch work, which
  // the peers' figures exclude (back-to-back launches); the lower counts, as
  // in bench/torch_attention_peer.py.
  // One untimed back-to-back pass first: the first row timed read 0.5-0.8 us
  // slower at S=512 than the same config timed after it.
  if (S < 8192) {
    BackToBackUs(fns[0], 50);
    for (size_t j = 0; j < fns.size(); ++j) t[j] = std::min(t[j], BackToBackUs(fns[j], 50));
  }
  const double ours = t[0];
  Add({"5", "attn_prefill", shape, "ours (default)", ours, tf(ours), "TFLOP/s", 100.0 * tf(ours) / g_gemm_tflops,
       Fmt("%.2fx FA2", fa2_us / ours) + Fmt(", %.2fx cuDNN", cudnn_us / ours)},
      {{"fa2_us", fa2_us}, {"cudnn_us", cudnn_us}});
  for (size_t j = 0; j < cands.size(); ++j) {
    const double u = t[1 + j];
    Add({"5", "attn_prefill", shape, "ours (" + cands[j] + ")", u, tf(u), "TFLOP/s", 100.0 * tf(u) / g_gemm_tflops,
         Fmt("%.2fx FA2", fa2_us / u) + Fmt(", %.2fx cuDNN", cudnn_us / u)},
        {{"config", cands[j]}});
  }
  FreeAll();
}

void Decode(int64_t B, int64_t L, double cudnn_us) {
  const std::vector<int64_t> k = ModelKey("attention_decode");
  const int64_t Hq = k[2], Hkv = k[3], D = k[4];
  const size_t kv = static_cast<size_t>(B) * L * Hkv * D * 2;
  const size_t set = 2 * kv + 2 * B * Hq * D * 2;
  const int copies = Copies(set);
  std::vector<void*> qs, ks, vs, os;
  for (int c = 0; c < copies; ++c) {
    qs.push_back(Alloc(B * Hq * D * 2));
    ks.push_back(Alloc(kv));
    vs.push_back(Alloc(kv));
    os.push_back(Alloc(B * Hq * D * 2, false));
  }
  std::vector<int64_t> lens(B, L);
  std::vector<int32_t> lens32(B, static_cast<int32_t>(L));
  void* dlens = Alloc(B * 4, false);
  BENCH_CHECK(cudaMemcpy(dlens, lens32.data(), B * 4, cudaMemcpyHostToDevice));
  OpRequest host;
  host.op = "attention_decode";
  host.spec = FindOpSpec(host.op);
  host.inputs = {{"q", Shape({B, Hq, D})},
                 {"k_cache", Shape({B, L, Hkv, D})},
                 {"v_cache", Shape({B, L, Hkv, D})},
                 {"lengths", HostTensor::FromInt64(DType::kI64, {B}, lens)}};
  host.attrs = {{"scale", 1.0 / std::sqrt(128.0)}};
  auto op = [&](const std::string& cfg) {
    return [&, cfg](int i) {
      const int c = i % copies;
      RunOp(host,
            {{"q", Dev({B, Hq, D}, qs[c])},
             {"k_cache", Dev({B, L, Hkv, D}, ks[c])},
             {"v_cache", Dev({B, L, Hkv, D}, vs[c])},
             {"lengths", Dev({B}, dlens, DType::kI32)}},
            {{"o", Dev({B, Hq, D}, os[c])}}, cfg);
    };
  };
  const double bytes = static_cast<double>(set);
  const std::string shape = "B=" + std::to_string(B) + " L=" + std::to_string(L) + " Hq=32 Hkv=8 D=128";
  auto gbs = [&](double us) { return bytes / (us * 1e-6) / 1e9; };
  const std::vector<std::string> cands = CudaCandidates("attention_decode", DType::kBF16, {B, L, Hq, Hkv, D});
  std::vector<std::function<void(int)>> fns = {op("")};
  for (const std::string& cfg : cands) fns.push_back(op(cfg));
  const std::vector<double> t = TimeUs(fns);
  const double ours = t[0];
  Add({"5", "attn_decode", shape, "ours (default)", ours, gbs(ours), "GB/s", 100.0 * gbs(ours) / g_copy_gbs,
       Fmt("%.2fx cuDNN", cudnn_us / ours)},
      {{"cudnn_us", cudnn_us}});
  double best = ours;
  std::string best_cfg = "default";
  nlohmann::json all = nlohmann::json::object();
  for (size_t j = 0; j < cands.size(); ++j) {
    all[cands[j]] = t[1 + j];
    if (t[1 + j] < best) best = t[1 + j], best_cfg = cands[j];
  }
  Add({"5", "attn_decode", shape, "ours (tuned " + best_cfg + ")", best, gbs(best), "GB/s",
       100.0 * gbs(best) / g_copy_gbs, Fmt("%.2fx cuDNN", cudnn_us / best)},
      {{"config", best_cfg}, {"candidates_us", all}});
  FreeAll();
}

// ---- decode-step GEMMs (llama-3.2-1b shapes, 16 to 64 token rows) ----------
// Each linear candidate of the tuner (cuBLASLt's algorithms: the best one
// reported; the skinny GEMM) and, for gate_up, the fused skinny SwiGLU, timed
// inside a CUDA graph of 20 launches over rotated weights, as the decode step
// runs them. Rate: weight bytes read per second (the floor), % of copy.
void DecodeGemm(int64_t M, const char* name, int64_t N, int64_t K, bool swiglu) {
  const int64_t rows = swiglu ? 2 * N : N;  // swiglu: N = I, gate_up [2I, K]
  const size_t wbytes = static_cast<size_t>(rows * K) * 2;
  const int copies = Copies(wbytes);
  std::vector<void*> ws;
  for (int c = 0; c < copies; ++c) ws.push_back(Alloc(wbytes));
  void* x = Alloc(M * K * 2);
  void* y = Alloc(M * rows * 2, false);
  OpRequest host;
  host.op = "linear";
  host.spec = FindOpSpec(host.op);
  host.inputs = {{"x", Shape({M, K})}, {"weight", Shape({rows, K})}};
  host.attrs = {{"activation", std::string("none")}};
  auto op = [&](const std::string& cfg) {
    return [&, cfg](int i) {
      RunOp(host, {{"x", Dev({M, K}, x)}, {"weight", Dev({rows, K}, ws[i % copies])}}, {{"y", Dev({M, rows}, y)}}, cfg);
    };
  };
  const std::string shape =
      std::string(name) + " M=" + std::to_string(M) + " N=" + std::to_string(rows) + " K=" + std::to_string(K);
  auto gbs = [&](double us) { return static_cast<double>(wbytes) / (us * 1e-6) / 1e9; };
  auto add = [&](const std::string& impl, double us, const std::string& vs) {
    Add({"6", "decode_gemm", shape, impl, us, gbs(us), "GB/s", 100.0 * gbs(us) / g_copy_gbs, vs});
  };
  double best_lt = 1e30;
  std::string best_lt_cfg;
  for (const std::string& cfg : CudaCandidates("linear", DType::kBF16, {M, rows, K})) {
    const double u = GraphUs(op(cfg), 20);
    if (cfg.compare(0, 2, "p0") == 0) {  // cuBLASLt algorithm: keep the best
      if (u < best_lt) best_lt = u, best_lt_cfg = cfg;
    } else {
      add("ours (" + cfg + ")", u, "");
    }
  }
  if (!best_lt_cfg.empty()) add("best cuBLASLt (" + best_lt_cfg + ")", best_lt, "");
  if (swiglu && cuda::SkinnyGemmSupported(DType::kBF16, M, N, K, x, ws[0])) {
    const double u = GraphUs(
        [&](int i) {
          BENCH_CHECK(cuda::LaunchSkinnySwiglu(DType::kBF16, M, K, N, x, ws[i % copies], y, g_stream).ok()
                          ? cudaSuccess
                          : cudaErrorUnknown);
        },
        20);
    add("skinny SwiGLU (fused)", u, Fmt("%.2fx best cuBLASLt", best_lt / u));
  }
  FreeAll();
}

// ---- rope + KV-cache write of a prefill chunk -------------------------------
// cuda::LaunchRopeKvWrite over T tokens of the fused QKV output (interleaved
// q/k pairs, as the model runner lays out wqkv): q rotated to a dense
// [T, Hq, D], k rotated and v copied to dense [T, Hkv, D] and to the cache.
// Rate: bytes read + written over the copy ceiling. The scalar kernel (a
// thread per pair, kept for unaligned shapes) runs when the cache pointers
// are off 16-byte alignment, which is how it is timed here.
void RopeKv(const char* model, int64_t T, int Hq, int Hkv, int D) {
  const int H3 = Hq + 2 * Hkv;
  const size_t qkv_b = static_cast<size_t>(T) * H3 * D * 2, q_b = static_cast<size_t>(T) * Hq * D * 2,
               kv_b = static_cast<size_t>(T) * Hkv * D * 2;
  std::vector<int32_t> pos(T), slots(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t % 2048), slots[t] = static_cast<int32_t>(t);
  auto* dpos = static_cast<int32_t*>(Alloc(T * 4, false));
  auto* dslots = static_cast<int32_t*>(Alloc(T * 4, false));
  BENCH_CHECK(cudaMemcpy(dpos, pos.data(), T * 4, cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(dslots, slots.data(), T * 4, cudaMemcpyHostToDevice));
  cuda::RopeKvParams p;
  p.dtype = DType::kBF16;
  p.qkv = Alloc(qkv_b);
  p.positions = dpos;
  p.cos_sin = static_cast<const float2*>(Alloc(2048 * D / 2 * sizeof(float2)));
  p.slots = dslots;
  p.q = Alloc(q_b, false);
  p.k = Alloc(kv_b, false);
  p.v = Alloc(kv_b, false);
  char* kc = static_cast<char*>(Alloc(kv_b + 16, false));
  char* vc = static_cast<char*>(Alloc(kv_b + 16, false));
  p.T = T;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.D = D;
  p.interleaved = true;
  auto run = [&](size_t cache_offset) {
    return [&, cache_offset](int) {
      cuda::RopeKvParams r = p;
      r.k_cache = kc + cache_offset;
      r.v_cache = vc + cache_offset;
      BENCH_CHECK(cuda::LaunchRopeKvWrite(r, g_stream).ok() ? cudaSuccess : cudaErrorUnknown);
    };
  };
  const std::vector<double> t = TimeUs({run(0), run(2)});
  const double bytes = static_cast<double>(qkv_b + q_b + 4 * kv_b);
  const std::string shape = std::string(model) + " T=" + std::to_string(T);
  auto gbs = [&](double us) { return bytes / (us * 1e-6) / 1e9; };
  Add({"7", "rope_kv", shape, "vector kernel (default)", t[0], gbs(t[0]), "GB/s", 100.0 * gbs(t[0]) / g_copy_gbs,
       Fmt("%.2fx scalar", t[1] / t[0])});
  Add({"7", "rope_kv", shape, "scalar kernel", t[1], gbs(t[1]), "GB/s", 100.0 * gbs(t[1]) / g_copy_gbs, ""});
  FreeAll();
}

// ---- paged decode attention (the model's kernel) ------------------------------
// cuda::LaunchPagedAttention for B decode rows of context ctx over a paged
// cache (block size 16, each launch through its own block tables into its own
// region of the cache, so K/V come from HBM as in a model step), split as the
// model's decode graphs split it. Each launch follows a small predecessor
// kernel (1 MB written, standing in for the rope kernel before it in a step):
// a CUDA graph of 20 (predecessor, attention) pairs, less a graph of the 20
// predecessors alone, is what the attention adds to a step. Rate: K/V bytes
// read per second.
void PagedDecode(const char* model, int Hq, int Hkv, int D, int B, int ctx) {
  constexpr int kBs = 16, kLong = 65536;
  const int width = (ctx + kBs - 1) / kBs;
  const size_t kv_bytes = static_cast<size_t>(B) * ctx * Hkv * D * 2;  // of K (as much of V)
  const int regions = static_cast<int>(std::clamp<size_t>((96ull << 20) / (2 * kv_bytes) + 1, 1, 256));
  const int64_t slots = static_cast<int64_t>(regions) * B * width * kBs;
  std::vector<int32_t> tables(static_cast<size_t>(regions) * B * width);
  std::iota(tables.begin(), tables.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(tables.begin(), tables.end(), rng);  // blocks scattered over the cache
  std::vector<int32_t> rows(B), ctxs(B, ctx);
  std::iota(rows.begin(), rows.end(), 0);
  auto upload = [](const std::vector<int32_t>& v) {
    auto* d = static_cast<int32_t*>(Alloc(v.size() * 4, false));
    BENCH_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  cuda::PagedAttentionParams p;
  p.dtype = DType::kBF16;
  p.q = Alloc(static_cast<size_t>(B) * Hq * D * 2);
  p.o = Alloc(static_cast<size_t>(B) * Hq * D * 2, false);
  p.k_cache = Alloc(static_cast<size_t>(slots) * Hkv * D * 2);
  p.v_cache = Alloc(static_cast<size_t>(slots) * Hkv * D * 2);
  p.rows = upload(rows);
  p.row_seq = upload(rows);
  p.ctx_lens = upload(ctxs);
  const int32_t* dtables = upload(tables);
  p.bt_stride = width;
  p.block_size = kBs;
  p.R = B;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.D = D;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  void* ws = Alloc(cuda::PagedAttentionWorkspaceBytes(Hq, D), false);
  BENCH_CHECK(cudaMemset(ws, 0, cuda::PagedAttentionWorkspaceBytes(Hq, D)));
  void* pred = Alloc(1 << 20, false);
  const int splits = cuda::PagedAttentionSplits(B, Hkv, kLong, g_sm_count);
  auto predecessor = [&] {
    BENCH_CHECK(cuda::LaunchPredecessor(pred, 1 << 20, g_stream).ok() ? cudaSuccess : cudaErrorUnknown);
  };
  auto pair = [&](int kernel) {
    return [&, kernel](int i) {
      predecessor();
      cuda::PagedAttentionParams r = p;
      r.block_tables = dtables + static_cast<size_t>(i % regions) * B * width;
      r.kernel = kernel;
      BENCH_CHECK(cuda::LaunchPagedAttention(r, splits, ws, g_stream).ok() ? cudaSuccess : cudaErrorUnknown);
    };
  };
  const double alone = GraphUs([&](int) { predecessor(); }, 20);
  const std::string shape = std::string(model) + " B=" + std::to_string(B) + " ctx=" + std::to_string(ctx) +
                            " splits=" + std::to_string(splits);
  double cores_us = 0;
  for (int kernel : {0, 1}) {
    const double us = std::max(0.01, GraphUs(pair(kernel), 20) - alone);
    if (kernel == 0) cores_us = us;
    const double gbs = 2.0 * static_cast<double>(kv_bytes) / (us * 1e-6) / 1e9;
    Add({"5", "paged_decode", shape, kernel == 0 ? "CUDA cores" : "tensor cores", us, gbs, "GB/s",
         100.0 * gbs / g_copy_gbs, Fmt("%.2fx CUDA cores", cores_us / us)},
        {{"predecessor_us", alone}});
  }
  FreeAll();
}

}  // namespace
}  // namespace fusedserve

int main(int argc, char** argv) {
  using namespace fusedserve;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  g_sm_count = prop.multiProcessorCount;
  BENCH_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  std::printf("device: %s (%d SMs), bf16, median of %d launches\n", prop.name, g_sm_count, kIters);
  std::printf("  %-12s %-34s %-30s %13s %17s %6s  %s\n", "op", "shape", "impl", "time", "rate", "%ceil", "vs");
  const std::string only = argc > 2 ? argv[2] : "";
  InitRandom();
  PlainLt lt;
  Ceilings(lt);
  // Peer times: docs/peers.md (H100, best implementation per row).
  if (only.empty() || only == "linear") {
    LinearGelu(lt, 16, 44.48);
    LinearGelu(lt, 512, 91.66);
    LinearGelu(lt, 4096, 677);
  }
  if (only == "gemm_algos") {
    GemmAlgos(4096, 14336, 4096, CUBLASLT_EPILOGUE_GELU_BIAS);
    GemmAlgos(4096, 14336, 4096, CUBLASLT_EPILOGUE_DEFAULT);
    GemmAlgos(4096, 28672, 4096, CUBLASLT_EPILOGUE_DEFAULT);
    GemmAlgos(4096, 4096, 14336, CUBLASLT_EPILOGUE_DEFAULT);
  }
  if (only.empty() || only == "swiglu") {
    SwigluMlp(lt, 1, 132);
    SwigluMlp(lt, 16, 136);
    SwigluMlp(lt, 256, 169);
    SwigluMlp(lt, 4096, 1971);
  }
  if (only.rfind("decode_gemm", 0) == 0) {  // "decode_gemm" or "decode_gemm:M" (one row count, for a profiler)
    std::vector<int64_t> ms = {16, 32, 48, 64};
    if (only.size() > 12) ms = {std::atol(only.c_str() + 12)};
    for (int64_t M : ms) {
      DecodeGemm(M, "qkv", 3072, 2048, false);
      DecodeGemm(M, "o_proj", 2048, 2048, false);
      DecodeGemm(M, "gate_up", 8192, 2048, true);
      DecodeGemm(M, "down", 2048, 8192, false);
      DecodeGemm(M, "lm_head", 128256, 2048, false);
    }
  }
  if (only.empty() || only == "rope_kv") {
    RopeKv("llama-3-8b", 4096, 32, 8, 128);
    RopeKv("llama-3.2-1b", 4096, 32, 8, 64);
    RopeKv("llama-3.2-1b", 64, 32, 8, 64);
  }
  if (only.rfind("prefill:", 0) == 0) {  // "prefill:B:S[:D]", one shape (for a profiler)
    int64_t b = 0, sl = 0, d = 0;
    if (std::sscanf(only.c_str(), "prefill:%ld:%ld:%ld", &b, &sl, &d) >= 2 && (d == 0 || d == 64 || d == 128)) {
      Prefill(b, sl, 1, 1, d);
    }
  }
  if (only.empty() || only == "prefill") {
    Prefill(1, 512, 21.80, 15.01);
    Prefill(1, 2048, 164, 83.73);
    Prefill(1, 8192, 1727, 938);
    Prefill(4, 512, 58.80, 33.92);
    Prefill(4, 2048, 475, 273);
    Prefill(4, 8192, 6454, 3492);
  }
  if (only.empty() || only == "decode") {
    Decode(1, 1024, 7.89);
    Decode(1, 4096, 12.96);
    Decode(1, 16384, 31.35);
    Decode(16, 1024, 27.53);
    Decode(16, 4096, 94.13);
    Decode(16, 16384, 352);
    Decode(64, 1024, 109);
    Decode(64, 4096, 357);
    Decode(64, 16384, 1388);
  }
  if (only == "paged") {
    for (int B : {1, 2, 4, 16, 64}) {
      for (int ctx : {128, 512, 2048}) {
        PagedDecode("1B", 32, 8, 64, B, ctx);
        PagedDecode("8B", 32, 8, 128, B, ctx);
      }
    }
  }
  nlohmann::json doc = {{"device", prop.name},
                        {"sm_count", g_sm_count},
                        {"copy_gbs", g_copy_gbs},
                        {"gemm_tflops", g_gemm_tflops},
                        {"rows", g_rows}};
  if (argc > 1) {
    std::ofstream(argv[1]) << doc.dump(2) << "\n";
  }
  // The table again, as markdown, last (the tail of the output is what survives).
  std::printf("\n| op | shape | impl | us | rate | %% of ceiling | vs |\n|---|---|---|---|---|---|---|\n");
  for (const Row& r : g_table) {
    std::printf("| %s | %s | %s | %.2f | %.1f %s | %.1f | %s |\n", r.op.c_str(), r.shape.c_str(), r.impl.c_str(), r.us,
                r.rate, r.unit.c_str(), r.pct, r.vs.c_str());
  }
  return 0;
}
