// Benchmark of the memory-bound CUDA ops (norms, softmax, activations, rope)
// at bf16, every candidate config of every shape, against the measured
// device-to-device copy bandwidth and the peers of docs/peers.md.
//
//   gpu_memory_bound_bench [OUT.json] [--quick]
//
//   flags: --quick (M in 1, 512, 16384), --max-m N, --no-pdl (launch without
//   programmatic dependent launch, as FUSEDSERVE_PDL=0)
//
// Method: the ceiling is cudaMemcpyAsync device-to-device over
// 1 GiB, counting bytes read + written. Each op call goes through
// RunCudaOp, the production path. Shapes: the model shapes of
// tests/gpu/op_cases.h. Inputs and outputs rotate over
// enough copies to span 5x the L2, M = 1 included (so every call reads cold
// data; the peers' M <= 32 rows were L2-resident); a CUDA graph of K
// back-to-back calls (K >= the number of copies) is replayed, each replay
// timed with events, per-call time = replay / K, median of the replays. Bytes: each input read once and each output
// written once (weights and biases included, positions 4 bytes per token):
//   rms_norm 2MH+H, add_rms_norm 4MH+H, add_rms_norm_silu 3MH+H,
//   layer_norm 2MH+2H, softmax 2MN, silu_and_mul 3MI, gelu 2MH,
//   rope 2T(Hq+Hkv)D  (elements; times 2 bytes for bf16).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/backend.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/op.h"
#include "tests/gpu/op_cases.h"

namespace fusedserve {
namespace {

using bench::CopyBandwidthGBs;
using bench::Median;

// Best peer GPU times (µs) from docs/peers.md, by "op M=.. shape" label.
struct Peer {
  double h100_us;
  double h200_us;
};
const std::map<std::string, Peer>& Peers() {
  static const std::map<std::string, Peer> m = [] {
    std::map<std::string, Peer> p;
    const int64_t ms[] = {1, 32, 512, 4096, 16384};
    auto add = [&](const std::string& label, std::vector<double> h100, std::vector<double> h200) {
      for (int i = 0; i < 5; ++i) p[label + " M=" + std::to_string(ms[i])] = {h100[i], h200[i]};
    };
    add("rms_norm H=4096", {1.68, 2.36, 4.81, 26.27, 93.73}, {1.61, 2.30, 4.30, 20.21, 68.94});
    add("rms_norm H=8192", {2.00, 2.87, 7.76, 49.09, 182}, {1.96, 2.82, 6.24, 37.37, 130});
    add("add_rms_norm H=4096", {1.73, 2.63, 7.70, 50.24, 183}, {1.71, 2.54, 6.00, 38.16, 135});
    add("layer_norm H=4096", {1.87, 2.59, 5.36, 26.93, 94.54}, {1.83, 2.51, 4.93, 21.58, 73.46});
    add("softmax N=32000", {4.83, 6.21, 31.31, 192, 735}, {4.82, 5.89, 27.54, 171, 660});
    add("softmax N=128256", {9.66, 20.25, 171, 1211, 4689}, {9.21, 17.41, 155, 1113, 4338});
    add("silu_and_mul I=14336", {1.36, 2.82, 17.82, 119, 465}, {1.26, 2.54, 13.16, 85.21, 328});
    add("rope 32x8x128", {1.50, 2.53, 5.68, 33.57, 122}, {1.43, 2.26, 4.68, 25.05, 88.22});
    add("gelu_tanh H=14336", {1.36, 2.47, 12.19, 82.08, 314}, {1.30, 2.32, 10.61, 68.18, 257});
    return p;
  }();
  return m;
}

struct Case {
  std::string label;  // "rms_norm H=4096" (+ " M=..")
  std::string op;
  std::vector<int64_t> key;
  Attrs attrs;
};

// The memory-bound model shapes of tests/gpu/op_cases.h at each M.
std::vector<Case> Cases(bool quick) {
  std::vector<Case> out;
  std::vector<int64_t> ms = {1, 32, 512, 4096, 16384};
  if (quick) ms = {1, 512, 16384};
  for (const testing::OpCase& c : testing::OpCases()) {
    if (!c.bench || !FindOpSpec(c.op)->memory_bound) continue;
    for (int64_t m : ms) {
      std::vector<int64_t> key = c.key;
      key[0] = m;
      out.push_back({c.label, c.op, key, c.attrs});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.label < b.label; });
  return out;
}

// A bf16 request carrying shapes only (no data), as the op describes its
// inputs for the key: enough for OutputShapes, TuningKey and the dispatch.
OpRequest ShapeRequest(const Case& c) {
  OpRequest r;
  r.op = c.op;
  r.spec = FindOpSpec(c.op);
  for (const AttrSpec& a : r.spec->attrs) r.attrs[a.name] = a.default_value;
  for (const auto& [k, v] : c.attrs) r.attrs[k] = v;
  for (const InputDesc& in : r.spec->inputs_for_key(c.key)) {
    HostTensor h;
    h.dtype = r.spec->is_index(in.name) ? DType::kI32 : DType::kBF16;
    h.shape = in.shape;
    r.inputs[in.name] = std::move(h);
  }
  return r;
}

int64_t Numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Random bf16 in [lo, hi) on the device, tiled from one uploaded block.
class RandomSource {
 public:
  RandomSource() {
    std::mt19937_64 rng(1234);
    for (auto [lo, hi, ptr] : {std::tuple{-1.0f, 1.0f, &uniform_}, std::tuple{0.5f, 1.5f, &weights_}}) {
      std::uniform_real_distribution<float> dist(lo, hi);
      std::vector<uint16_t> h(kElems);
      for (auto& v : h) v = FloatToBf16(dist(rng));
      BENCH_CHECK(cudaMalloc(ptr, kElems * 2));
      BENCH_CHECK(cudaMemcpy(*ptr, h.data(), kElems * 2, cudaMemcpyHostToDevice));
    }
  }
  void Fill(void* dst, int64_t elems, bool weight) const {
    const char* src = static_cast<const char*>(weight ? weights_ : uniform_);
    for (int64_t off = 0; off < elems; off += kElems) {
      const int64_t n = std::min<int64_t>(kElems, elems - off);
      BENCH_CHECK(cudaMemcpy(static_cast<char*>(dst) + off * 2, src, n * 2, cudaMemcpyDeviceToDevice));
    }
  }

 private:
  // Prime-ish so that rows of power-of-two length do not repeat exactly.
  static constexpr int64_t kElems = (int64_t{1} << 24) + 4099;
  void* uniform_ = nullptr;
  void* weights_ = nullptr;
};

struct ConfigResult {
  std::string config;
  double us = 0;
  std::string error;
};

// Times one config: median over replays of a graph of K calls, µs per call.
ConfigResult TimeConfig(const OpRequest& r, const std::vector<DeviceTensorMap>& ins,
                        const std::vector<DeviceTensorMap>& outs, const std::string& cfg, cudaStream_t stream) {
  ConfigResult res;
  res.config = cfg;
  DispatchContext ctx;
  ctx.stream = stream;
  ctx.config = [&cfg](const std::string&, DType, const std::vector<int64_t>&) { return cfg; };
  const size_t sets = ins.size();
  auto call = [&](size_t i) -> bool {
    bool handled = false;
    const CudaStatus s = RunCudaOp(r, ins[i % sets], outs[i % sets], ctx, &handled);
    if (!handled || !s.ok()) {
      res.error = handled ? s.message : "not handled";
      return false;
    }
    return true;
  };
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  // Warm-up over every set, then a rough per-call time to size the graph.
  for (size_t i = 0; i < sets; ++i)
    if (!call(i)) return res;
  BENCH_CHECK(cudaStreamSynchronize(stream));
  const int probe = static_cast<int>(std::clamp<size_t>(sets, 5, 500));
  BENCH_CHECK(cudaEventRecord(e0, stream));
  for (int i = 0; i < probe; ++i) call(i);
  BENCH_CHECK(cudaEventRecord(e1, stream));
  BENCH_CHECK(cudaEventSynchronize(e1));
  float probe_ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&probe_ms, e0, e1));
  const double est_us = std::max(1.0, probe_ms * 1e3 / probe);
  // K calls per graph: about 3 ms of work, and every rotation set once.
  const int k = std::max(static_cast<int>(std::clamp(3000.0 / est_us, 8.0, 1000.0)), static_cast<int>(sets));

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  bool ok = true;
  for (int i = 0; i < k && ok; ++i) ok = call(i);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  if (!ok) {
    cudaGraphDestroy(graph);
    return res;
  }
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  res.us = bench::GraphReplayUs(stream, exec, k, k >= 2000 ? 5 : 10);
  BENCH_CHECK(cudaGetLastError());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return res;
}

std::string Fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace
}  // namespace fusedserve

int main(int argc, char** argv) {
  using namespace fusedserve;
  std::string json_path;
  bool quick = false;
  int64_t max_m = INT64_MAX;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--no-pdl") == 0) {
      setenv("FUSEDSERVE_PDL", "0", 1);  // read once, at the first launch
    } else if (std::strcmp(argv[i], "--max-m") == 0 && i + 1 < argc) {
      max_m = std::atoll(argv[++i]);
    } else {
      json_path = argv[i];
    }
  }
  const char* pdl_env = std::getenv("FUSEDSERVE_PDL");
  const bool pdl = !(pdl_env != nullptr && pdl_env[0] == '0');
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  const bool h200 = std::string(prop.name).find("H200") != std::string::npos;
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbs = CopyBandwidthGBs(stream);
  std::printf("device %s, %d SMs, L2 %d MB; copy ceiling (D2D, read+write) %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);
  const RandomSource source;

  nlohmann::json rows = nlohmann::json::array();
  struct Line {
    std::string label, cfg, us, gbs, pct, peer, ratio, target;
  };
  std::vector<Line> lines;
  for (const Case& c : Cases(quick)) {
    if (c.key[0] > max_m) continue;
    const OpRequest r = ShapeRequest(c);
    // Bytes per call and per rotation set.
    int64_t bytes = 0;
    for (const auto& [name, t] : r.inputs) bytes += Numel(t.shape) * DTypeSize(t.dtype);
    const auto out_shapes = OutputShapes(r);
    for (const auto& [name, shape] : out_shapes) bytes += Numel(shape) * 2;
    // Rotation: every tensor of every set in one allocation per tensor name,
    // sets spanning 5x the L2 (each call's data is cold in L2).
    const int64_t l2 = prop.l2CacheSize;
    const size_t sets = static_cast<size_t>(std::clamp<int64_t>((5 * l2 + bytes - 1) / bytes, 1, 16384));
    std::vector<void*> allocs;
    std::vector<DeviceTensorMap> ins(sets), outs(sets);
    auto pool = [&](const std::string& name, DType dt, const std::vector<int64_t>& shape, bool input,
                    std::vector<DeviceTensorMap>& maps) {
      const int64_t n = Numel(shape);
      const int64_t stride = (n * static_cast<int64_t>(DTypeSize(dt)) + 255) / 256 * 256;
      char* base = nullptr;
      BENCH_CHECK(cudaMalloc(&base, stride * sets));
      allocs.push_back(base);
      if (dt == DType::kI32) {
        std::vector<int32_t> pos(static_cast<size_t>(stride / 4 * sets));
        for (size_t s = 0; s < sets; ++s)
          for (int64_t i = 0; i < n; ++i) pos[s * (stride / 4) + i] = static_cast<int32_t>(i);
        BENCH_CHECK(cudaMemcpy(base, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
      } else if (input) {
        source.Fill(base, stride * static_cast<int64_t>(sets) / 2, name == "weight");
      }
      for (size_t s = 0; s < sets; ++s) maps[s][name] = DeviceTensor{dt, shape, base + stride * s};
    };
    for (const auto& [name, t] : r.inputs) {
      pool(name, t.dtype, t.shape, true, ins);
    }
    for (const auto& [name, shape] : out_shapes) pool(name, DType::kBF16, shape, false, outs);
    std::vector<std::string> configs = CudaCandidates(c.op, DType::kBF16, TuningKey(r));
    std::vector<ConfigResult> results;
    ConfigResult best;
    for (const std::string& cfg : configs) {
      ConfigResult res = TimeConfig(r, ins, outs, cfg, stream);
      if (!res.error.empty()) std::fprintf(stderr, "%s %s: %s\n", c.label.c_str(), cfg.c_str(), res.error.c_str());
      if (res.error.empty() && (best.us == 0 || res.us < best.us)) best = res;
      results.push_back(res);
    }
    for (void* p : allocs) BENCH_CHECK(cudaFree(p));

    const std::string label = c.label + " M=" + std::to_string(c.key[0]);
    const double gbs = best.us > 0 ? bytes / (best.us * 1e-6) / 1e9 : 0;
    const double pct = 100.0 * gbs / copy_gbs;
    double peer_us = 0;
    if (auto it = Peers().find(label); it != Peers().end()) peer_us = h200 ? it->second.h200_us : it->second.h100_us;
    // The targets for this row (beat the best peer; near the copy ceiling at scale).
    const int64_t m = c.key[0];
    std::string target;
    bool met = true;
    if (peer_us > 0) met = met && best.us < peer_us;
    if (m == 16384) met = met && pct >= 95.0;
    if (m == 4096) met = met && pct >= 92.0;
    if (m == 512 && peer_us > 0) met = met && best.us * 1.1 <= peer_us;
    if (c.op == "softmax" && c.key[1] == 128256 && m >= 4096) met = met && pct >= 90.0;
    target = best.us > 0 ? (met ? "met" : "MISSED") : "ERROR";

    nlohmann::json row = {{"label", label},        {"op", c.op},
                          {"key", c.key},          {"bytes", bytes},
                          {"rotation_sets", sets}, {"best_config", best.config},
                          {"us", best.us},         {"gb_per_s", gbs},
                          {"pct_of_copy", pct},    {"peer_us", peer_us},
                          {"target", target}};
    nlohmann::json all = nlohmann::json::array();
    for (const ConfigResult& res : results) {
      nlohmann::json j = {{"config", res.config}, {"us", res.us}};
      if (!res.error.empty()) j["error"] = res.error;
      all.push_back(j);
    }
    row["configs"] = all;
    rows.push_back(row);
    lines.push_back({label, best.config, Fmt("%.2f", best.us), Fmt("%.0f", gbs), Fmt("%.1f", pct),
                     peer_us > 0 ? Fmt("%.2f", peer_us) : "-",
                     peer_us > 0 && best.us > 0 ? Fmt("%.2fx", peer_us / best.us) : "-", target});
    std::fflush(stdout);
  }

  std::printf("\n| op / shape | best config | µs | GB/s | %% of copy | best peer µs | speed-up | targets |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Line& l : lines) {
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", l.label.c_str(), l.cfg.c_str(), l.us.c_str(),
                l.gbs.c_str(), l.pct.c_str(), l.peer.c_str(), l.ratio.c_str(), l.target.c_str());
  }
  std::printf("copy ceiling %.0f GB/s on %s; programmatic dependent launch %s; peers: docs/peers.md %s table\n",
              copy_gbs, prop.name, pdl ? "on" : "off (FUSEDSERVE_PDL=0)", h200 ? "H200" : "H100");
  if (!json_path.empty()) {
    nlohmann::json doc = {{"device", prop.name},
                          {"sm_count", prop.multiProcessorCount},
                          {"l2_bytes", prop.l2CacheSize},
                          {"copy_gb_per_s", copy_gbs},
                          {"dtype", "bf16"},
                          {"pdl", pdl},
                          {"rows", rows}};
    std::ofstream(json_path) << doc.dump(1) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  BENCH_CHECK(cudaStreamDestroy(stream));
  return 0;
}
