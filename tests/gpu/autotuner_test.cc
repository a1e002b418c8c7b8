// The CUDA autotuner on a real GPU: tunes a few ops, checks that every
// winner's output matches the CPU reference through the CUDA backend, that
// a second start over the same cache file is warm (nothing timed), and that
// the CUDA model runner reads the configs tuned for the model's kernels.
// FUSEDSERVE_TUNE_DEFAULT_ENVELOPE=1 also cold-tunes the full default
// envelope and prints the numbers of the warm-up closing note (wall time,
// warm restart time, speed-up over the default config at M = 1, 512, 16384).
// Skips without a GPU.
#include "warmup/autotuner.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/op.h"
#include "model/config.h"
#include "model/cuda_runner.h"
#include "model/kernel_shapes.h"
#include "model/runner.h"
#include "model/weights.h"
#include "tests/gpu/model_configs.h"
#include "tests/gpu/rel_error.h"
#include "warmup/envelope.h"
#include "warmup/tuning_cache.h"

namespace fusedserve {
namespace {

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "/autotuner_test.XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

const std::vector<EnvelopeEntry>& SomeEntries() {
  static const std::vector<EnvelopeEntry> entries = {
      {"rms_norm", DType::kBF16, {1, 4096}},
      {"rms_norm", DType::kBF16, {512, 4096}},
      {"add_rms_norm", DType::kBF16, {64, 4096}},
      {"softmax", DType::kBF16, {8, 32000}},
      {"silu_and_mul", DType::kBF16, {32, 14336}},
      {"rope", DType::kBF16, {128, 32, 8, 128}},
      {"linear", DType::kBF16, {16, 4096, 4096}},
      {"attention", DType::kBF16, {512, 32, 8, 128}},
      {"attention_decode", DType::kBF16, {4, 1024, 32, 8, 128}},
  };
  return entries;
}

TEST(Autotuner, WinnersMatchTheCpuReference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU";
  std::unique_ptr<Tuner> tuner = MakeCudaTuner();
  ASSERT_NE(tuner, nullptr);
  std::printf("stamp: %s\n", tuner->Stamp().ToString().c_str());
  std::map<std::string, std::string> winners;  // EntryId -> config
  for (const EnvelopeEntry& e : SomeEntries()) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<TuneResult> r = tuner->Tune(e, nullptr);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(r.ok()) << e.op << ": " << r.status();
    std::string line = e.op + " " + FormatTuningKey(e.op, e.key) + ": " + std::to_string(r->candidates) +
                       " candidates, " + std::to_string(r->benchmarks) + " timed";
    for (const CandidateTime& c : r->accepted) line += ", " + c.config + " " + std::to_string(c.us) + " us";
    for (const auto& [config, why] : r->rejected) line += ", REJECTED " + config + " (" + why + ")";
    std::printf("%s [%.2f s]\n", line.c_str(), s);
    if (!r->supported) {
      std::printf("  not supported: %s\n", r->note.c_str());
      continue;
    }
    if (r->candidates > 1) {
      EXPECT_FALSE(r->accepted.empty()) << e.op;
      EXPECT_EQ(r->benchmarks, static_cast<int64_t>(r->accepted.size()));
      for (const CandidateTime& c : r->accepted) EXPECT_GT(c.us, 0) << e.op << " " << c.config;
      // The default config is always valid, so it is never rejected.
      for (const auto& [config, why] : r->rejected) EXPECT_NE(config, r->default_config);
    }
    winners[EntryId(e.op, e.dtype, e.key)] = r->accepted.empty() ? r->default_config : r->accepted[0].config;
  }
  tuner->Release();

  // Run each winner through the serving backend and compare with the CPU oracle.
  absl::StatusOr<std::unique_ptr<Backend>> cuda =
      MakeCudaBackend(0, [&](const std::string& op, DType dtype, const std::vector<int64_t>& key) {
        auto it = winners.find(EntryId(op, dtype, BucketKey(op, key)));
        return it == winners.end() ? std::string() : it->second;
      });
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  for (const EnvelopeEntry& e : SomeEntries()) {
    if (!winners.count(EntryId(e.op, e.dtype, e.key))) continue;
    const OpRequest req = MakeRandomRequest(e.op, e.dtype, e.key, 42);
    absl::StatusOr<TensorMap> got = (*cuda)->Run(req);
    absl::StatusOr<TensorMap> want = cpu->Run(req);
    ASSERT_TRUE(got.ok()) << e.op << ": " << got.status();
    ASSERT_TRUE(want.ok()) << e.op << ": " << want.status();
    for (const auto& [name, t] : *want) {
      const double rel = RelErrorNorm(got->at(name), t);
      std::printf("%s %s winner %s: %s rel error %.2e\n", e.op.c_str(), FormatTuningKey(e.op, e.key).c_str(),
                  winners[EntryId(e.op, e.dtype, e.key)].c_str(), name.c_str(), rel);
      EXPECT_LT(rel, 2e-2) << e.op << " " << name;
    }
  }
}

std::unique_ptr<TuningService> Service(const WarmupOptions& o) {
  std::unique_ptr<Tuner> tuner = MakeCudaTuner();
  const CacheStamp stamp = tuner->Stamp();
  absl::StatusOr<std::unique_ptr<TuningService>> s = CreateTuningService(o, stamp, std::move(tuner));
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

TEST(Autotuner, ColdStartTunesSecondStartIsWarm) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU";
  const std::string dir = TempDir();
  std::ofstream(dir + "/env.json") << R"([
      {"op": "rms_norm", "dtype": "bf16", "key": [1, 4096]},
      {"op": "rms_norm", "dtype": "bf16", "key": [4096, 4096]},
      {"op": "gelu", "dtype": "bf16", "key": [512, 14336]},
      {"op": "linear", "dtype": "bf16", "key": [1, 6144, 4096]},
      {"op": "attention_decode", "dtype": "bf16", "key": [16, 4096, 32, 8, 128]}])";
  WarmupOptions o;
  o.cache_path = dir + "/cache.json";
  o.envelope_path = dir + "/env.json";
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(0, nullptr);
  ASSERT_TRUE(backend.ok());
  auto log = [](const std::string& l) { std::printf("  %s\n", l.c_str()); };

  std::unique_ptr<TuningService> cold = Service(o);
  ASSERT_TRUE(cold->Warmup(backend->get(), log).ok());
  const WarmupReport c = cold->report();
  EXPECT_EQ(c.misses, 5);
  EXPECT_GT(c.benchmarks, 0);
  EXPECT_EQ(c.entries, 5);

  std::unique_ptr<TuningService> warm = Service(o);
  ASSERT_TRUE(warm->Warmup(backend->get(), log).ok());
  const WarmupReport w = warm->report();
  EXPECT_EQ(w.cache_state, "loaded");
  EXPECT_EQ(w.hits, 5);
  EXPECT_EQ(w.benchmarks, 0);
  std::printf("cold %.2f s (%lld configs timed), warm %.2f s\n", c.seconds, static_cast<long long>(c.benchmarks),
              w.seconds);
}

// The closing-note numbers: opt-in, it takes about a minute.
TEST(Autotuner, DefaultEnvelopeColdAndWarm) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU";
  if (std::getenv("FUSEDSERVE_TUNE_DEFAULT_ENVELOPE") == nullptr) {
    GTEST_SKIP() << "set FUSEDSERVE_TUNE_DEFAULT_ENVELOPE=1";
  }
  const std::string dir = TempDir();
  WarmupOptions o;
  o.cache_path = dir + "/cache.json";
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCudaBackend(0, nullptr);
  ASSERT_TRUE(backend.ok());
  auto log = [](const std::string& l) {
    std::printf("  %s\n", l.c_str());
    std::fflush(stdout);
  };

  std::unique_ptr<TuningService> cold = Service(o);
  ASSERT_TRUE(cold->Warmup(backend->get(), log).ok());
  const WarmupReport c = cold->report();

  std::unique_ptr<TuningService> warm = Service(o);
  ASSERT_TRUE(warm->Warmup(backend->get(), log).ok());
  const WarmupReport w = warm->report();
  EXPECT_EQ(w.benchmarks, 0);
  std::printf(
      "default envelope: %zu entries; cold tune %.1f s (%lld configs timed); warm restart %.2f s, "
      "%lld timed\n",
      cold->envelope().size(), c.seconds, static_cast<long long>(c.benchmarks), w.seconds,
      static_cast<long long>(w.benchmarks));
  std::printf("speed-up of the tuned config over the default (default us / tuned us):\n");
  for (const TuningEntry& e : TuningCache::Open(o.cache_path, MakeCudaTuner()->Stamp())->entries()) {
    if (e.key[0] != 1 && e.key[0] != 512 && e.key[0] != 16384) continue;
    if (e.time_us <= 0 || e.default_us <= 0) continue;
    std::printf("  %-18s %-28s %-14s %9.2f us  default %9.2f us  x%.2f\n", e.op.c_str(),
                FormatTuningKey(e.op, e.key).c_str(), e.config.c_str(), e.time_us, e.default_us,
                e.default_us / e.time_us);
  }
}

// After the warm-up has tuned a model's envelope, the CUDA model runner's
// lookups (every kernel at every token bucket up to its buffers' size, made
// when its KV cache is created, before the decode graphs are captured) are
// all cache hits, a prefill and a decode step look up nothing new, and the
// logits still match the CPU runner's.
TEST(Autotuner, ModelRunnerReadsTunedConfigs) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU";
  ModelConfig c = MidConfig();
  c.layers = 2;
  const int64_t max_tokens = 256, max_seqs = 8;
  WarmupOptions o;
  o.max_tokens = max_tokens;
  o.dtype = c.dtype;
  o.model_entries = ModelEnvelope(c, max_tokens, max_seqs);
  o.model_shapes = {{c.hidden, c.intermediate, c.q_heads, c.kv_heads, c.head_dim, c.vocab}};
  std::unique_ptr<TuningService> service = Service(o);
  ASSERT_TRUE(service->Warmup(nullptr, nullptr).ok());
  EXPECT_GT(service->report().benchmarks, 0);

  CudaModelRunnerOptions ro;
  ro.max_tokens = max_tokens;
  ro.max_seqs = max_seqs;
  ro.max_graph_batch = max_seqs;
  ro.tuned = service->counted_lookup();
  absl::StatusOr<std::unique_ptr<ModelRunner>> gpu = MakeCudaModelRunner(ModelWeights::Random(c, 7), ro);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<ModelRunner>> cpu = MakeCpuModelRunner(ModelWeights::Random(c, 7), 0);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int64_t bs = 16, blocks = 64;
  ASSERT_TRUE((*gpu)->InitKvCache(blocks, bs).ok());
  ASSERT_TRUE((*cpu)->InitKvCache(blocks, bs).ok());
  const LookupCounts at_start = service->counts();
  // 8 kernels at buckets 1 ... 256, the LM head at 1 ... 8.
  EXPECT_EQ(at_start.keys, (kModelKernels - 1) * 9 + 4);
  EXPECT_EQ(at_start.hits, at_start.keys) << (at_start.missed.empty() ? "" : at_start.missed[0]);

  // A prefill step of three prompts, then two decode steps (graphs).
  std::mt19937 rng(3);
  const std::vector<int64_t> lens = {5, 37, 100};
  std::vector<std::vector<int32_t>> tokens(lens.size()), tables(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    for (int64_t t = 0; t < lens[i]; ++t) tokens[i].push_back(static_cast<int32_t>(rng() % c.vocab));
    for (int b = 0; b < 8; ++b) tables[i].push_back(static_cast<int32_t>(i * 8 + b));
  }
  std::vector<int64_t> cached(lens.size(), 0);
  double worst = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<SeqForward> batch;
    for (size_t i = 0; i < lens.size(); ++i) {
      SeqForward f;
      f.start = cached[i];
      f.tokens = tokens[i].data() + cached[i];
      f.num_tokens = static_cast<int64_t>(tokens[i].size()) - cached[i];
      f.block_table = tables[i].data();
      f.num_blocks = static_cast<int64_t>(tables[i].size());
      batch.push_back(f);
    }
    std::vector<float> lc, lg;
    ASSERT_TRUE((*cpu)->ForwardLogits(batch, &lc).ok());
    absl::Status s = (*gpu)->ForwardLogits(batch, &lg);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(lc.size(), lg.size());
    for (size_t i = 0; i < lens.size(); ++i) {
      const double e = RelErrorNorm(lg.data() + i * c.vocab, lc.data() + i * c.vocab, c.vocab);
      worst = std::max(worst, e);
      EXPECT_LT(e, 3e-2) << "step " << step << " sequence " << i;
      cached[i] = static_cast<int64_t>(tokens[i].size());
      const float* row = lc.data() + i * c.vocab;
      tokens[i].push_back(static_cast<int32_t>(std::max_element(row, row + c.vocab) - row));
    }
  }
  const LookupCounts after = service->counts();
  EXPECT_EQ(after.keys, at_start.keys);
  EXPECT_EQ(after.hits, after.keys);
  std::printf("model runner: %lld of %lld kernel shape buckets read tuned configs; worst logits rel err %.3e\n",
              static_cast<long long>(after.hits), static_cast<long long>(after.keys), worst);
}

}  // namespace
}  // namespace fusedserve
