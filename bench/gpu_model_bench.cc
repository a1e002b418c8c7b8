// Model benchmarks of the CUDA model runner (random bf16 weights):
//   1. decode step of the llama-3.2-1b preset through ModelRunner::Forward:
//      B = 1, 2, 4, 16, 64 sequences, contexts 128 and 2048, one token each, greedy
//      (index upload, the step replayed from its CUDA graph, device argmax,
//      B token ids copied back: what the engine pays per greedy step).
//   2. the same model through the Engine (scheduler, continuous batching,
//      sampling, sinks): B requests submitted at once, time per output token.
//   3. one llama-3-8b layer: prefill B=2 S=2048, decode B=1 ctx=2048 and
//      decode B=64 ctx=128, timed as Forward(2 layers) - Forward(1 layer)
//      (embedding, LM head and copies cancel; the two run alternately and the
//      median of the paired differences is reported).
// Floor: bytes a step must read (every weight once, the tied embedding read
// by the LM head, the K/V of B x ctx positions over all layers) at the
// device-to-device copy bandwidth measured in the same run (read + write),
// as in docs/peers.md. Medians of 50 steps after 5 warm-up steps.
//   1b. prefill steps of the 1B model: B = 1, 4 prompts of 512 and 2048 tokens.
//   1c. later prefill chunks of the 1B model (FS_BENCH=chunk only): a chunk
//      at start > 0 (prefix-cache hit, chunked prefill) on the flash kernel
//      over its K/V gathered from the cache vs on paged attention
//      (FUSEDSERVE_CHUNK_FLASH=0 for the second runner), beside the whole
//      prompt from position 0.
//   5. tensor parallelism (FS_BENCH=tp only): the whole llama-3-8b preset
//      on N = 1, 2, 4 GPUs (as many as there are; FS_TP_LIST=1,2 to choose),
//      N = 1 on the plain runner: decode step at B = 1 and 16, ctx 2048, and
//      prefill B=2 S=2048; each N's time over the first row's (N = 1
//      unless FS_TP_LIST starts higher), and prefill scaling efficiency
//      t1 / (N tN) against it.
// FS_BENCH=decode|prefill|chunk|engine|8b|gemm|tp: that section only.
// FS_DECODE_BATCHES=1,40,64: section 1's batch sizes (up to 64).
// FS_TUNE=1: runners on tuned configs (the model's envelope tuned first).
// FS_TP=N: runners split over N GPUs (tensor parallelism over NCCL; N=1
// takes that path on one GPU: what the rank thread and a one-rank
// all-reduce cost).
// FS_PROFILE=1: only one warm 1B decode step at B=1 and B=16 (ctx 2048)
// between cudaProfilerStart/Stop, for `ncu --profile-from-start off`.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_common.h"
#include "engine/engine.h"
#include "kernels/cuda/gemm.h"
#include "model/cuda_runner.h"
#include "model/kernel_shapes.h"
#include "model/weights.h"
#include "nlohmann/json.hpp"
#include "warmup/tuning_cache.h"
#include "warmup/warmup.h"

namespace fusedserve {
namespace {

using Clock = std::chrono::steady_clock;

// FS_TUNE=1: the runners read tuned configs, as in the server: the model's
// own envelope (model/kernel_shapes.h) is tuned first into a cache file
// shared by every runner of the run (FS_TUNE_CACHE, default
// /tmp/fs_model_bench_tuning.json), then each runner gets a counted lookup.
bool Tuned() {
  const char* t = std::getenv("FS_TUNE");
  return t != nullptr && t[0] == '1';
}

std::vector<std::unique_ptr<TuningService>> g_services;  // alive as long as their runners

ConfigLookup TuneModel(const ModelConfig& c, int64_t max_tokens, int64_t max_seqs) {
  const char* path = std::getenv("FS_TUNE_CACHE");
  const std::string envelope_path = "/tmp/fs_model_bench_envelope.json";
  nlohmann::json env = nlohmann::json::array();
  for (const EnvelopeEntry& e : ModelEnvelope(c, max_tokens, max_seqs)) {
    env.push_back({{"op", e.op}, {"dtype", DTypeFileName(e.dtype)}, {"key", e.key}});
  }
  std::ofstream(envelope_path) << env.dump();
  WarmupOptions o;
  o.cache_path = path != nullptr ? path : "/tmp/fs_model_bench_tuning.json";
  o.envelope_path = envelope_path;
  absl::StatusOr<std::unique_ptr<TuningService>> s = TuningService::Create(o);
  if (!s.ok()) {
    std::printf("tuning: %s\n", std::string(s.status().message()).c_str());
    std::exit(1);
  }
  if (absl::Status st = (*s)->Warmup(nullptr, nullptr); !st.ok()) {
    std::printf("tuning: %s\n", std::string(st.message()).c_str());
    std::exit(1);
  }
  const WarmupReport r = (*s)->report();
  std::printf("tuning %s: envelope of %zu entries, %lld in the cache, %lld tuned (%lld configs timed) in %.1f s\n",
              c.name.c_str(), (*s)->envelope().size(), static_cast<long long>(r.hits), static_cast<long long>(r.misses),
              static_cast<long long>(r.benchmarks), r.seconds);
  g_services.push_back(*std::move(s));
  return g_services.back()->counted_lookup();
}

// tensor_parallel: 0 reads FS_TP (N GPUs through the NCCL path, N = 1 too);
// N >= 1 takes N GPUs, N = 1 on the plain runner.
std::unique_ptr<ModelRunner> MakeRunner(const ModelConfig& c, int64_t max_tokens, int64_t kv_blocks, int64_t bs,
                                        int tensor_parallel = 0) {
  CudaModelRunnerOptions o;
  o.max_tokens = max_tokens;
  o.max_seqs = 64;
  o.max_graph_batch = 64;
  if (Tuned()) o.tuned = TuneModel(c, max_tokens, o.max_seqs);
  if (tensor_parallel > 0) {
    o.tensor_parallel = tensor_parallel;
  } else if (const char* tp = std::getenv("FS_TP")) {
    o.tensor_parallel = std::max(1, std::atoi(tp));
    o.force_tensor_parallel_path = true;
  }
  absl::StatusOr<std::unique_ptr<ModelRunner>> made = MakeCudaModelRunner(ModelWeights::Random(c, 1), o);
  if (!made.ok()) {
    std::printf("runner: %s\n", std::string(made.status().message()).c_str());
    std::exit(1);
  }
  if (kv_blocks > 0) {
    if (absl::Status s = (*made)->InitKvCache(kv_blocks, bs); !s.ok()) {
      std::printf("kv cache: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  }
  if (Tuned()) {
    const LookupCounts n = g_services.back()->counts();
    std::printf("runner: %lld of %lld kernel shape buckets read tuned configs from the cache\n",
                static_cast<long long>(n.hits), static_cast<long long>(n.keys));
    // What the decode buckets run (the built-in rule: GEMV at 1 row, skinny <= 32, algo=0 beyond).
    const ConfigLookup lookup = g_services.back()->lookup();
    const char* names[kModelKernels] = {"input_norm", "add_norm", "qkv",       "o_proj", "swiglu",
                                        "gate_up",    "down",     "attention", "lm_head"};
    for (int64_t m : {1, 16, 64}) {
      std::printf("  M=%-3ld", static_cast<long>(m));
      for (int k = 0; k < kModelKernels; ++k) {
        const ModelKernelKey key = KeyOfModelKernel(c, static_cast<ModelKernel>(k), m);
        const std::string config = lookup(key.op, c.dtype, key.key);
        std::printf(" %s=%s", names[k], config.empty() ? "-" : config.c_str());
      }
      std::printf("\n");
    }
    if (kv_blocks > 0) std::printf("decode graphs kept: %s\n", CudaDecodeGraphReport(**made).c_str());
  }
  return std::move(*made);
}

// B sequences of `len` tokens each (block tables disjoint), whose next step
// is `num_tokens` tokens at position `start`.
struct Batch {
  std::vector<std::vector<int32_t>> tables, toks;
  std::vector<SeqForward> seqs;
  Batch(int64_t B, int64_t start, int64_t num_tokens, int64_t per_seq, int64_t vocab) : tables(B), toks(B), seqs(B) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < per_seq; ++i) tables[b].push_back(static_cast<int32_t>(b * per_seq + i));
      for (int64_t i = 0; i < num_tokens; ++i) toks[b].push_back(static_cast<int32_t>((b * 7919 + i * 31) % vocab));
      seqs[b].tokens = toks[b].data();
      seqs[b].num_tokens = num_tokens;
      seqs[b].start = start;
      seqs[b].block_table = tables[b].data();
      seqs[b].num_blocks = per_seq;
      seqs[b].want_logits = false;  // greedy: device argmax only
    }
  }
};

// Wall time of one Forward, ms; a failed Forward ends the benchmark.
double ForwardMs(ModelRunner& r, const std::vector<SeqForward>& batch, ForwardOutput* out) {
  auto a = Clock::now();
  if (absl::Status s = r.Forward(batch, out); !s.ok()) {
    std::printf("forward: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - a).count();
}

// Median wall time of Forward over `iters` steps after 5 warm-up steps, ms.
double MedianForwardMs(ModelRunner& r, const std::vector<SeqForward>& batch, int iters = 50) {
  ForwardOutput out;
  std::vector<double> ms;
  for (int it = 0; it < iters + 5; ++it) {
    const double t = ForwardMs(r, batch, &out);
    if (it >= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One layer's time as the difference of a 2-layer and a 1-layer Forward of
// the same batch, the two run alternately so that both see the same clock
// and power state (long prefills move the boost clock by 10-20%): the median
// of `iters` paired differences, with the quartiles printed.
double MedianLayerMs(ModelRunner& one, ModelRunner& two, const std::vector<SeqForward>& batch, int iters,
                     const char* what) {
  ForwardOutput out;
  std::vector<double> d;
  for (int it = 0; it < iters + 3; ++it) {
    const double a = ForwardMs(one, batch, &out), b = ForwardMs(two, batch, &out);
    if (it >= 3) d.push_back(b - a);
  }
  std::sort(d.begin(), d.end());
  std::printf("  (%s: layer quartiles %.4f / %.4f / %.4f ms)\n", what, d[d.size() / 4], d[d.size() / 2],
              d[3 * d.size() / 4]);
  return d[d.size() / 2];
}

// Collects one generation's result.
class WaitSink : public GenerationSink {
 public:
  bool IsCancelled() override { return false; }
  bool OnToken(int32_t, const TokenLogprobs*) override { return true; }
  void OnFinish(const absl::Status& status, const GenerationResult& result) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    result_ = result;
    done_ = true;
  }
  GenerationResult Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (!status_.ok()) {
      std::printf("generation failed: %s\n", std::string(status_.message()).c_str());
      std::exit(1);
    }
    return result_;
  }

 private:
  absl::Mutex mu_;
  bool done_ = false;
  absl::Status status_;
  GenerationResult result_;
};

void DecodeTable(const ModelConfig& c, double bw) {
  const int64_t bs = 16, maxB = 64, max_ctx = 2048, per_seq = max_ctx / bs + 1;
  auto t0 = Clock::now();
  std::unique_ptr<ModelRunner> r = MakeRunner(c, 2048, maxB * per_seq + 16, bs);
  std::printf("\n1. decode step, %s: %.2f GB of bf16 weights; set-up %.1f s\n", c.name.c_str(),
              c.NumParameters() * 2 / 1e9, std::chrono::duration<double>(Clock::now() - t0).count());
  const double weight_bytes = static_cast<double>(c.NumParameters()) * 2;
  std::printf("%4s %6s %10s %10s %8s %10s\n", "B", "ctx", "step_ms", "floor_ms", "%floor", "tokens/s");
  std::vector<int64_t> batches = {1, 2, 4, 16, 64};
  if (const char* e = std::getenv("FS_DECODE_BATCHES")) {  // e.g. FS_DECODE_BATCHES=40,64
    batches.clear();
    for (absl::string_view part : absl::StrSplit(e, ',', absl::SkipWhitespace())) {
      int64_t b = 0;
      if (absl::SimpleAtoi(part, &b) && b >= 1 && b <= maxB) batches.push_back(b);
    }
  }
  for (int64_t ctx : {128, 2048}) {
    for (int64_t B : batches) {
      Batch batch(B, ctx - 1, 1, per_seq, c.vocab);  // attends over ctx keys
      const double med = MedianForwardMs(*r, batch.seqs);
      const double kv_bytes = static_cast<double>(B) * ctx * c.layers * c.kv_dim() * 2 * 2;
      const double floor_ms = (weight_bytes + kv_bytes) / bw * 1e3;
      std::printf("%4ld %6ld %10.3f %10.3f %7.1f%% %10.0f\n", static_cast<long>(B), static_cast<long>(ctx), med,
                  floor_ms, 100.0 * floor_ms / med, B / (med * 1e-3));
    }
  }
}

// Prefill steps of the 1B model: B prompts of S tokens from position 0 in
// one Forward (flash attention, the GEMMs at M = B*S rows), what a prompt's
// time to first token costs on the device.
void PrefillTable(const ModelConfig& c) {
  const int64_t bs = 16, max_s = 2048, per_seq = max_s / bs + 1;
  std::unique_ptr<ModelRunner> r = MakeRunner(c, 8192, 4 * per_seq + 16, bs);
  std::printf("\n1b. prefill step, %s (one Forward from position 0)\n", c.name.c_str());
  std::printf("%4s %6s %10s %10s\n", "B", "S", "step_ms", "TFLOP/s");
  const double params = static_cast<double>(c.NumParameters()) - static_cast<double>(c.vocab) * c.hidden;
  for (auto [B, S] : {std::pair<int64_t, int64_t>{1, 512}, {1, 2048}, {4, 512}, {4, 2048}}) {
    Batch batch(B, 0, S, per_seq, c.vocab);
    const double med = MedianForwardMs(*r, batch.seqs, 20);
    // GEMM work of B*S rows (LM head on B rows) and causal attention.
    const double flops =
        2.0 * B * S * params + 2.0 * B * c.vocab * c.hidden + 4.0 * B * S * S / 2 * c.q_dim() * c.layers;
    std::printf("%4ld %6ld %10.3f %10.0f\n", static_cast<long>(B), static_cast<long>(S), med,
                flops / (med * 1e-3) / 1e12);
  }
}

// Later chunks: B sequences whose first `start` tokens are cached, the rest
// (n tokens) in one Forward; the flash path vs paged attention (a second
// runner made with FUSEDSERVE_CHUNK_FLASH=0, read at its creation).
void ChunkTable(const ModelConfig& c) {
  const int64_t bs = 16, max_s = 2048, per_seq = max_s / bs + 1;
  std::unique_ptr<ModelRunner> flash = MakeRunner(c, 8192, 4 * per_seq + 16, bs);
  setenv("FUSEDSERVE_CHUNK_FLASH", "0", 1);
  std::unique_ptr<ModelRunner> paged = MakeRunner(c, 8192, 4 * per_seq + 16, bs);
  unsetenv("FUSEDSERVE_CHUNK_FLASH");
  std::printf("\n1c. later prefill chunk, %s (one Forward of n tokens after `start` cached ones)\n", c.name.c_str());
  std::printf("%4s %6s %6s %10s %10s %10s %10s\n", "B", "start", "n", "flash_ms", "TFLOP/s", "paged_ms", "speedup");
  const double params = static_cast<double>(c.NumParameters()) - static_cast<double>(c.vocab) * c.hidden;
  for (auto [B, start, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 0, 2048},
                             {1, 128, 1920},
                             {1, 1024, 1024},
                             {1, 1536, 512},
                             {4, 128, 1920}}) {
    Batch batch(B, start, n, per_seq, c.vocab);
    const double f = MedianForwardMs(*flash, batch.seqs, 20);
    const double pg = MedianForwardMs(*paged, batch.seqs, 20);
    // GEMMs of B*n rows (LM head on B rows) and causal attention of n rows over start + their own keys.
    const double flops =
        2.0 * B * n * params + 2.0 * B * c.vocab * c.hidden + 4.0 * B * n * (start + n / 2.0) * c.q_dim() * c.layers;
    std::printf("%4ld %6ld %6ld %10.3f %10.0f %10.3f %9.2fx\n", static_cast<long>(B), static_cast<long>(start),
                static_cast<long>(n), f, flops / (f * 1e-3) / 1e12, pg, pg / f);
  }
}

void EngineTable(const ModelConfig& c, double bw) {
  const int64_t bs = 16;
  EngineOptions eo;
  eo.kv_block_size = bs;
  eo.kv_cache_blocks = 64 * (2048 / bs + 2);
  eo.max_running = 64;
  eo.max_batched_tokens = 8192;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(MakeRunner(c, 8192, 0, bs), nullptr, eo);
  if (!engine.ok()) {
    std::printf("engine: %s\n", std::string(engine.status().message()).c_str());
    std::exit(1);
  }
  const double weight_bytes = static_cast<double>(c.NumParameters()) * 2;
  std::printf("\n2. through the engine (greedy, B requests at once, time per output token)\n");
  std::printf("%4s %7s %7s %10s %10s %8s %10s\n", "B", "prompt", "new", "tpot_ms", "floor_ms", "%floor", "tokens/s");
  for (int64_t prompt : {128, 1920}) {
    for (int64_t B : {1, 16, 64}) {
      const int64_t new_tokens = 128;
      std::vector<std::shared_ptr<WaitSink>> sinks;
      for (int64_t b = 0; b < B; ++b) {
        GenerationRequest req;
        for (int64_t i = 0; i < prompt; ++i) req.prompt.push_back(static_cast<int32_t>((b * 131 + i * 17) % c.vocab));
        req.max_new_tokens = new_tokens;
        sinks.push_back(std::make_shared<WaitSink>());
        if (absl::Status s = (*engine)->Submit(std::move(req), sinks.back()); !s.ok()) {
          std::printf("submit: %s\n", std::string(s.message()).c_str());
          std::exit(1);
        }
      }
      double tpot = 0;
      for (auto& s : sinks) tpot += s->Wait().time_per_output_token_s;
      tpot = tpot / B * 1e3;
      const double mean_ctx = prompt + new_tokens / 2.0;
      const double kv_bytes = static_cast<double>(B) * mean_ctx * c.layers * c.kv_dim() * 2 * 2;
      const double floor_ms = (weight_bytes + kv_bytes) / bw * 1e3;
      std::printf("%4ld %7ld %7ld %10.3f %10.3f %7.1f%% %10.0f\n", static_cast<long>(B), static_cast<long>(prompt),
                  static_cast<long>(new_tokens), tpot, floor_ms, 100.0 * floor_ms / tpot, B / (tpot * 1e-3));
    }
  }
}

void Layer8bTable(double bw) {
  ModelConfig c = *PresetConfig("llama-3-8b");
  c.vocab = 256;  // the LM head cancels in the difference anyway
  const int64_t bs = 16, per_seq = 2048 / bs + 1, per_seq64 = 128 / bs + 1;
  std::unique_ptr<ModelRunner> r[2];
  for (int layers = 1; layers <= 2; ++layers) {
    c.layers = layers;
    r[layers - 1] = MakeRunner(c, 4096, std::max(2 * per_seq, 64 * per_seq64) + 16, bs);
  }
  std::printf(
      "\n3. one llama-3-8b layer (Forward of 2 layers - 1 layer, run alternately, median of the differences)\n");
  Batch pre(2, 0, 2048, per_seq, c.vocab);
  Batch dec(1, 2047, 1, per_seq, c.vocab);
  Batch dec64(64, 127, 1, per_seq64, c.vocab);  // 64 sequences: the skinny / cuBLASLt rows
  const double pf_ms = MedianLayerMs(*r[0], *r[1], pre.seqs, 30, "prefill");
  const double dc_ms = MedianLayerMs(*r[0], *r[1], dec.seqs, 50, "decode B=1");
  const double dc64_ms = MedianLayerMs(*r[0], *r[1], dec64.seqs, 50, "decode B=64");
  // One layer's weights (bf16) and, for decode, its K/V of 2048 positions.
  c.layers = 1;
  const double layer_w = (static_cast<double>(c.NumParameters()) - 2.0 * c.vocab * c.hidden - c.hidden) * 2;
  const double kv = 2048.0 * c.kv_dim() * 2 * 2;
  const double pf_flops =
      2.0 * 4096 * layer_w / 2 + 4.0 * 2 * 2048.0 * 2048 / 2 * c.q_dim();  // GEMMs + causal attention
  std::printf("prefill B=2 S=2048: %.3f ms (%.0f TFLOP/s)\n", pf_ms, pf_flops / (pf_ms * 1e-3) / 1e12);
  std::printf("decode B=1 ctx=2048: %.1f us (floor %.1f us at copy bandwidth, %.1f%%)\n", dc_ms * 1e3,
              (layer_w + kv) / bw * 1e6, 100.0 * (layer_w + kv) / bw * 1e3 / dc_ms);
  const double kv64 = 64 * 128.0 * c.kv_dim() * 2 * 2;
  std::printf("decode B=64 ctx=128: %.1f us (floor %.1f us at copy bandwidth, %.1f%%)\n", dc64_ms * 1e3,
              (layer_w + kv64) / bw * 1e6, 100.0 * (layer_w + kv64) / bw * 1e3 / dc64_ms);
}

// The whole llama-3-8b preset split over N GPUs. Decode: 2 all-reduces of
// B x 4096 bf16 per layer (8 KB at B = 1), latency-bound; weights and K/V
// read per GPU fall as 1/N (the embedding is replicated, the LM head split
// by vocabulary rows, or replicated and run on rank 0 in the "plain" rows).
// Floor per N: (weights / N + head (/ N) + K/V / N) at the copy bandwidth.
void TensorParallelTable(double bw) {
  const ModelConfig c = *PresetConfig("llama-3-8b");
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  std::vector<int> sizes;
  if (const char* list = std::getenv("FS_TP_LIST")) {
    for (const char* p = list; *p != '\0';) {
      sizes.push_back(std::atoi(p));
      while (*p != '\0' && *p != ',') ++p;
      if (*p == ',') ++p;
    }
  } else {
    for (int n : {1, 2, 4}) {
      if (n <= gpus) sizes.push_back(n);
    }
  }
  const int64_t bs = 16, per_seq = 2048 / bs + 1;
  const double head_bytes = 2.0 * c.vocab * c.hidden;
  const double body_bytes = static_cast<double>(c.NumParameters()) * 2 - 2 * head_bytes;
  std::printf("\n5. tensor parallelism, %s (%.2f GB bf16), ms\n", c.name.c_str(), c.NumParameters() * 2 / 1e9);
  std::printf("%-9s %8s %9s %8s %14s %9s %13s %8s %6s\n", "N", "decode B=1", "floor", "vs N=1", "decode B=16", "vs N=1",
              "prefill 2x2048", "vs N=1", "eff");
  double base[3] = {0, 0, 0};
  int base_n = 0;  // the first row's N: the ratios and the efficiency are against it
  // N > 1 twice: "plain" without the vocabulary-parallel head, the rope
  // fusion and the fused all-reduce + norm on ranks (their switches at 0),
  // then as built (the environment's FUSEDSERVE_TP_SYMMETRIC=1 applies to
  // both; FS_TP_PLAIN=0: no plain rows).
  const char* plain_env[] = {"FUSEDSERVE_TP_VOCAB_PARALLEL", "FUSEDSERVE_DECODE_FUSION", "FUSEDSERVE_TP_FUSED_NORM"};
  std::vector<std::optional<std::string>> caller_env;  // restored for the rows as built, and at the end
  for (const char* e : plain_env) {
    const char* v = std::getenv(e);
    caller_env.push_back(v == nullptr ? std::nullopt : std::optional<std::string>(v));
  }
  auto set_env = [&](bool plain) {
    for (size_t i = 0; i < caller_env.size(); ++i) {
      if (plain) {
        setenv(plain_env[i], "0", 1);
      } else if (caller_env[i]) {
        setenv(plain_env[i], caller_env[i]->c_str(), 1);
      } else {
        unsetenv(plain_env[i]);
      }
    }
  };
  const char* plain_rows = std::getenv("FS_TP_PLAIN");
  const bool with_plain = plain_rows == nullptr || std::string(plain_rows) != "0";
  for (int n : sizes) {
    if (n > gpus) {
      std::printf("%3d skipped: %d GPU(s)\n", n, gpus);
      continue;
    }
    for (bool plain : {true, false}) {
      if (plain && (n == 1 || !with_plain)) continue;
      set_env(plain);
      auto t0 = Clock::now();
      std::unique_ptr<ModelRunner> r = MakeRunner(c, 4096, 16 * per_seq + 16, bs, n);
      const double setup_s = std::chrono::duration<double>(Clock::now() - t0).count();
      Batch d1(1, 2047, 1, per_seq, c.vocab), d16(16, 2047, 1, per_seq, c.vocab), pre(2, 0, 2048, per_seq, c.vocab);
      // FS_TP_DECODE_ONLY=1: the B=1 decode step alone (for a profiler's trace).
      const bool decode_only = std::getenv("FS_TP_DECODE_ONLY") != nullptr;
      const double t[3] = {MedianForwardMs(*r, d1.seqs), decode_only ? 0.0 : MedianForwardMs(*r, d16.seqs),
                           decode_only ? 0.0 : MedianForwardMs(*r, pre.seqs, 10)};
      if (base_n == 0) {
        std::copy(t, t + 3, base);
        base_n = n;
      }
      const double kv = 2048.0 * c.layers * c.kv_dim() * 2 * 2;
      const double head = n > 1 && !plain ? head_bytes / n : head_bytes;
      const double floor_ms = ((body_bytes + kv) / n + head) / bw * 1e3;  // embedding: B rows only
      std::printf("%3d%-6s %8.3f %9.3f %7.2fx %14.3f %8.2fx %13.3f %7.2fx %5.0f%%   (set-up %.0f s)\n", n,
                  plain ? " plain" : "", t[0], floor_ms, t[0] / base[0], t[1], t[1] / base[1], t[2], t[2] / base[2],
                  100.0 * base[2] * base_n / (n * t[2]), setup_s);
    }
  }
  set_env(false);
}

// cuBLASLt's candidate algorithms on the decode GEMMs of a batch of M
// sequences (the step runs M > cuda::kGemvMaxM through cuBLASLt): time of each,
// and the weight-read bandwidth it reaches.
void GemmAlgoTable(const ModelConfig& c, double bw) {
  std::printf("\n4. cuBLASLt algorithms on the 1B decode GEMMs (median of 50, us | weight GB/s)\n");
  const int64_t D = c.hidden, I = c.intermediate, qkv = c.q_dim() + 2 * c.kv_dim();
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  const Shape shapes[] = {{"qkv", qkv, D}, {"o_proj", D, c.q_dim()}, {"gate_up", 2 * I, D}, {"down", D, I}};
  void *x = nullptr, *w = nullptr, *y = nullptr;
  cudaMalloc(&x, 64 * I * 2);
  cudaMalloc(&w, 2 * I * D * 2);
  cudaMalloc(&y, 64 * 2 * I * 2);
  cudaMemset(x, 0, 64 * I * 2);
  cudaMemset(w, 0, 2 * I * D * 2);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int64_t M : {16, 32, 64}) {
    for (const Shape& sh : shapes) {
      cuda::GemmParams a;
      a.dtype = DType::kBF16;
      a.M = M;
      a.N = sh.N;
      a.K = sh.K;
      a.x = x;
      a.w = w;
      a.y = y;
      const int n = cuda::GemmAlgoCount(a.dtype, M, sh.N, sh.K);
      std::printf("M=%-3ld %-8s", static_cast<long>(M), sh.name);
      for (int algo = 0; algo < n; ++algo) {
        std::vector<float> us;
        for (int it = 0; it < 55; ++it) {
          cudaEventRecord(e0);
          if (!cuda::GemmForward(a, algo, nullptr).ok()) break;
          cudaEventRecord(e1);
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          if (it >= 5) us.push_back(ms * 1e3f);
        }
        if (us.empty()) continue;
        std::sort(us.begin(), us.end());
        const double t = us[us.size() / 2];
        std::printf(" | %d: %5.1f %4.0f", algo, t, sh.N * sh.K * 2 / (t * 1e-6) / 1e9);
      }
      std::printf("\n");
    }
  }
  (void)bw;
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
}

void Profile(const ModelConfig& c) {
  const int64_t bs = 16, per_seq = 2048 / bs + 1;
  std::unique_ptr<ModelRunner> r = MakeRunner(c, 2048, 16 * per_seq + 16, bs);
  for (int64_t B : {1, 16}) {
    Batch batch(B, 2047, 1, per_seq, c.vocab);
    MedianForwardMs(*r, batch.seqs, 3);
    ForwardOutput out;
    cudaProfilerStart();
    if (absl::Status s = r->Forward(batch.seqs, &out); !s.ok()) std::exit(1);
    cudaProfilerStop();
  }
}

int Main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device; skipped\n");
    return 0;
  }
  const ModelConfig c = *PresetConfig("llama-3.2-1b");
  const char* prof = std::getenv("FS_PROFILE");
  if (prof != nullptr && prof[0] == '1') {
    Profile(c);
    return 0;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double bw = bench::CopyBandwidthGBs(nullptr) * 1e9;  // bytes/s, read + write
  std::printf("device %s, copy bandwidth %.0f GB/s (read + write)\n", prop.name, bw / 1e9);
  const char* only = std::getenv("FS_BENCH");  // e.g. FS_BENCH=gemm runs only that section
  const std::string sel = only == nullptr ? "" : only;
  if (sel.empty() || sel == "decode") DecodeTable(c, bw);
  if (sel.empty() || sel == "prefill") PrefillTable(c);
  if (sel == "chunk") ChunkTable(c);
  if (sel.empty() || sel == "engine") EngineTable(c, bw);
  if (sel.empty() || sel == "8b") Layer8bTable(bw);
  if (sel.empty() || sel == "gemm") GemmAlgoTable(c, bw);
  if (sel == "tp") TensorParallelTable(bw);
  return 0;
}

}  // namespace
}  // namespace fusedserve

int main() { return fusedserve::Main(); }
