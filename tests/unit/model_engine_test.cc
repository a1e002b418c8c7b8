// The generation engine in-process on the tiny model: KV block allocator,
// sampler, the CPU runner's paged forward against its own whole-sequence
// path, and the scheduler (continuous batching gives the same tokens as
// running alone, preemption under a small cache, queue limits, cancellation).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/cpu/reference.h"

namespace fusedserve {
namespace {

TEST(KvBlockAllocatorTest, AllocatesAllOrNothingAndFrees) {
  KvBlockAllocator a(8, 16);
  std::vector<int32_t> t1, t2;
  EXPECT_TRUE(a.EnsureCapacity(&t1, 33));  // 3 blocks
  EXPECT_EQ(t1.size(), 3u);
  EXPECT_TRUE(a.EnsureCapacity(&t1, 48));  // still 3
  EXPECT_EQ(t1.size(), 3u);
  EXPECT_TRUE(a.EnsureCapacity(&t1, 49));
  EXPECT_EQ(a.num_used(), 4);
  EXPECT_FALSE(a.EnsureCapacity(&t2, 16 * 5));  // 5 > 4 free
  EXPECT_TRUE(t2.empty());
  EXPECT_TRUE(a.EnsureCapacity(&t2, 16 * 4));
  EXPECT_EQ(a.num_free(), 0);
  std::set<int32_t> ids(t1.begin(), t1.end());
  ids.insert(t2.begin(), t2.end());
  EXPECT_EQ(ids.size(), 8u);  // no block handed out twice
  a.Free(&t1);
  EXPECT_TRUE(t1.empty());
  EXPECT_EQ(a.num_free(), 4);
  a.Free(&t2);
  EXPECT_EQ(a.num_used(), 0);
}

// Prefix caching: published full blocks are shared by a later table with
// the same leading tokens, kept while idle, evicted least recently released
// first, and a chain never matches through a block reused for other content.
TEST(KvBlockAllocatorTest, PrefixCacheSharesKeepsAndEvicts) {
  constexpr int64_t kBs = 4;
  KvBlockAllocator a(6, kBs, /*prefix_caching=*/true);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
  std::vector<int32_t> t1;
  ASSERT_TRUE(a.EnsureCapacity(&t1, 13));  // 4 blocks
  int64_t published = 0;
  a.Publish(tokens.data(), 9, t1, &published);  // K/V written for 9 positions: 2 full blocks
  EXPECT_EQ(published, 2);
  a.Publish(tokens.data(), 12, t1, &published);
  EXPECT_EQ(published, 3);

  // Shared while t1 still holds them; the match never covers max_positions' last block partly.
  std::vector<int32_t> t2;
  EXPECT_EQ(a.MatchPrefix(tokens.data(), 12, &t2), 12);
  EXPECT_EQ(t2, std::vector<int32_t>(t1.begin(), t1.begin() + 3));
  std::vector<int32_t> t3;
  EXPECT_EQ(a.MatchPrefix(tokens.data(), 11, &t3), 8);
  std::vector<int32_t> other = tokens;
  other[5] = 99;  // differs in the second block
  std::vector<int32_t> t4;
  EXPECT_EQ(a.MatchPrefix(other.data(), 12, &t4), 4);
  EXPECT_EQ(a.num_used(), 4);    // shared blocks count once
  EXPECT_EQ(a.num_shared(), 3);  // t1's first three
  a.Free(&t2);
  a.Free(&t3);
  a.Free(&t4);
  EXPECT_EQ(a.num_shared(), 0);
  a.Free(&t1);
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_EQ(a.num_cached_idle(), 3);  // the unpublished 4th block went back to the free list
  EXPECT_EQ(a.num_free(), 6);

  // Idle cached blocks are found again...
  std::vector<int32_t> t5;
  EXPECT_EQ(a.MatchPrefix(tokens.data(), 13, &t5), 12);
  EXPECT_EQ(a.num_cached_idle(), 0);
  a.Free(&t5);
  // ...and evicted when an allocation needs them (never-cached blocks first).
  std::vector<int32_t> big;
  ASSERT_TRUE(a.EnsureCapacity(&big, 4 * kBs));  // 3 free + 1 evicted
  EXPECT_EQ(a.num_cached_idle(), 2);
  ASSERT_TRUE(a.EnsureCapacity(&big, 6 * kBs));
  EXPECT_EQ(a.num_cached_idle(), 0);
  // The chain's blocks now hold other content: nothing matches, even if a
  // reused block is published under new content.
  int64_t pb = 0;
  const std::vector<int32_t> junk(6 * kBs, 42);
  a.Publish(junk.data(), 6 * kBs, big, &pb);
  std::vector<int32_t> t6;
  EXPECT_EQ(a.MatchPrefix(tokens.data(), 13, &t6), 0);
  EXPECT_TRUE(t6.empty());
  a.Free(&big);

  // Without prefix caching nothing is kept or matched.
  KvBlockAllocator plain(4, kBs);
  std::vector<int32_t> p1;
  ASSERT_TRUE(plain.EnsureCapacity(&p1, 8));
  int64_t pp = 0;
  plain.Publish(tokens.data(), 8, p1, &pp);
  plain.Free(&p1);
  EXPECT_EQ(plain.num_cached_idle(), 0);
  EXPECT_EQ(plain.MatchPrefix(tokens.data(), 8, &p1), 0);
}

TEST(SamplerTest, GreedyTopKAndReproducibility) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f};
  SamplerRng rng(1);
  EXPECT_EQ(SampleToken(logits.data(), 5, SamplingParams{}, rng), 1);  // first of the ties
  SamplingParams k1{1.0f, 1, 1.0f, 0};
  EXPECT_EQ(SampleToken(logits.data(), 5, k1, rng), 1);
  SamplingParams p_small{1.0f, 0, 0.01f, 0};
  EXPECT_EQ(SampleToken(logits.data(), 5, p_small, rng), 1);
  // Same seed, same draws; another seed, another sequence.
  SamplingParams hot{2.0f, 0, 0.95f, 0};
  auto draw = [&](uint64_t seed) {
    SamplerRng r(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(SampleToken(logits.data(), 5, hot, r));
    return out;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
  // top_k=2 only ever returns the two best tokens; frequencies follow softmax.
  SamplingParams k2{1.0f, 2, 1.0f, 0};
  SamplerRng r(5);
  int ones = 0;
  for (int i = 0; i < 2000; ++i) {
    const int32_t t = SampleToken(logits.data(), 5, k2, r);
    ASSERT_TRUE(t == 1 || t == 3);
    ones += t == 1;
  }
  EXPECT_NEAR(ones / 2000.0, 0.5, 0.05);
}

// top-p over a large vocabulary sorts only a growing prefix; the draws must
// be those of a full sort (the rule the sampler documents), and plain
// temperature sampling must follow softmax(logits / T).
TEST(SamplerTest, TopPPrefixSortMatchesFullSort) {
  const int64_t V = 50000;
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(V);
  for (float& x : logits) x = nd(gen);
  logits[123] = logits[456] = 9.0f;  // a tie at the top
  auto reference = [&](const SamplingParams& p, SamplerRng& rng) {
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(),
              [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    const double mx = logits[idx[0]], inv_t = 1.0 / p.temperature;
    const int64_t keep0 = p.top_k > 0 && p.top_k < V ? p.top_k : V;
    std::vector<double> prob(keep0);
    double total = 0;
    for (int64_t i = 0; i < keep0; ++i) total += (prob[i] = std::exp((logits[idx[i]] - mx) * inv_t));
    int64_t keep = 0;
    double cum = 0;
    while (keep < keep0 && cum < p.top_p) cum += prob[keep++] / total;
    total = 0;
    for (int64_t i = 0; i < keep; ++i) total += prob[i];
    const double u = rng.Uniform() * total;
    cum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += prob[i];
      if (u < cum) return idx[i];
    }
    return idx[keep - 1];
  };
  for (const SamplingParams& p : {SamplingParams{1.0f, 0, 0.9f, 0}, SamplingParams{3.0f, 0, 0.95f, 0},
                                  SamplingParams{0.7f, 1000, 0.5f, 0}, SamplingParams{5.0f, 0, 0.999f, 0}}) {
    SamplerRng a(11), b(11);
    for (int i = 0; i < 50; ++i) {
      ASSERT_EQ(SampleToken(logits.data(), V, p, a), reference(p, b)) << "T=" << p.temperature << " top_p=" << p.top_p;
    }
  }
  // Plain temperature: frequencies of a 3-token vocabulary follow softmax.
  std::vector<float> three = {0.0f, std::log(2.0f), std::log(5.0f)};  // probabilities 1/8, 2/8, 5/8
  SamplerRng r(3);
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 8000; ++i) ++counts[SampleToken(three.data(), 3, SamplingParams{1.0f, 0, 1.0f, 0}, r)];
  EXPECT_NEAR(counts[0] / 8000.0, 0.125, 0.02);
  EXPECT_NEAR(counts[1] / 8000.0, 0.25, 0.02);
  EXPECT_NEAR(counts[2] / 8000.0, 0.625, 0.02);
}

// NaN never wins the greedy pick; ties go to the lowest index.
TEST(SamplerTest, GreedyNanAndTies) {
  const float nan = std::nanf("");
  std::vector<float> a = {nan, 1.0f, 3.0f, 3.0f, nan};
  EXPECT_EQ(cpu::GreedyToken(a.data(), 5), 2);
  std::vector<float> all_nan = {nan, nan};
  EXPECT_EQ(cpu::GreedyToken(all_nan.data(), 2), 0);
}

std::unique_ptr<ModelRunner> TinyRunner(uint64_t seed = 3) {
  absl::StatusOr<ModelConfig> c = PresetConfig("tiny");
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = MakeCpuModelRunner(ModelWeights::Random(*c, seed), 1);
  EXPECT_TRUE(r.ok());
  return *std::move(r);
}

// Paged prefill of a whole prompt, prefill of a prefix then one-token
// decodes, and the whole-sequence TransformerBlock path + final norm +
// lm_head all give the same last-token logits.
TEST(CpuRunnerTest, PagedForwardMatchesWholeSequencePath) {
  auto runner = TinyRunner();
  const ModelConfig& c = runner->config();
  ASSERT_TRUE(runner->InitKvCache(16, 4).ok());
  const std::vector<int32_t> tokens = {5, 17, 300, 2, 9, 511, 0, 44, 8, 100};
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<int32_t> table1 = {0, 1, 2}, table2 = {7, 3, 11};  // scattered blocks

  std::vector<float> full;
  ASSERT_TRUE(runner->ForwardLogits({SeqForward{tokens.data(), n, 0, table1.data(), 3}}, &full).ok());
  std::vector<float> step;
  ASSERT_TRUE(runner->ForwardLogits({SeqForward{tokens.data(), 6, 0, table2.data(), 3}}, &step).ok());
  for (int64_t p = 6; p < n; ++p) {
    ASSERT_TRUE(runner->ForwardLogits({SeqForward{tokens.data() + p, 1, p, table2.data(), 3}}, &step).ok());
  }
  ASSERT_EQ(full.size(), static_cast<size_t>(c.vocab));
  EXPECT_EQ(full, step);  // same loops, same order: bit-identical

  // Independent attention path (cpu::Attention over the whole sequence).
  std::vector<float> hidden(n * c.hidden);
  auto w = ModelWeights::Random(c, 3);
  const std::vector<float> embed = w->Get("model.embed_tokens.weight").ToFloat();
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(embed.data() + tokens[t] * c.hidden, c.hidden, hidden.data() + t * c.hidden);
  }
  std::vector<int64_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = t;
  ASSERT_TRUE(runner->RunLayers(0, c.layers, 1, n, pos.data(), hidden.data()).ok());
  std::vector<float> normed(c.hidden), logits(c.vocab);
  cpu::RmsNorm(hidden.data() + (n - 1) * c.hidden, w->Get("model.norm.weight").ToFloat().data(), 1, c.hidden,
               static_cast<float>(c.rms_eps), normed.data());
  cpu::Linear(normed.data(), w->Get("lm_head.weight").ToFloat().data(), nullptr, 1, c.hidden, c.vocab,
              Activation::kNone, logits.data());
  for (int64_t v = 0; v < c.vocab; ++v) EXPECT_NEAR(logits[v], full[v], 1e-4f * (1 + std::fabs(full[v])));
}

// TransformerBlock cut into row chunks through the KV cache (every chunk
// size, chunks that end one sequence and start the next, scattered blocks,
// positions that are not 0..S-1) gives the whole-sequence RunLayers result.
TEST(CpuRunnerTest, ChunkedLayersMatchWholeSequencePath) {
  auto runner = TinyRunner();
  const ModelConfig& c = runner->config();
  const int64_t B = 3, S = 37, D = c.hidden, bs = 4;
  ASSERT_TRUE(runner->InitKvCache(64, bs).ok());
  ASSERT_TRUE(runner->SupportsLayersChunked());
  std::vector<float> input(B * S * D);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (float& v : input) v = dist(gen);
  std::vector<int64_t> pos(B * S);
  for (int64_t i = 0; i < B * S; ++i) pos[i] = 100 + 3 * (i % S) + i / S;
  for (auto [first, n] : {std::pair<int64_t, int64_t>{0, 2}, {1, 1}}) {
    std::vector<float> whole = input;
    ASSERT_TRUE(runner->RunLayers(first, n, B, S, pos.data(), whole.data()).ok());
    std::vector<float> one_chunk;
    for (int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{36}, S, B * S}) {
      KvBlockAllocator alloc(64, bs);
      std::vector<int32_t> spare;
      ASSERT_TRUE(alloc.EnsureCapacity(&spare, 7 * bs));  // the sequences' blocks are not 0, 1, 2...
      std::vector<std::vector<int32_t>> tables(B);
      std::vector<float> h = input;
      for (int64_t r = 0; r < B * S;) {
        const int64_t end = std::min(B * S, r + chunk);
        std::vector<SeqForward> batch;
        for (int64_t x = r; x < end;) {
          const int64_t b = x / S, i = x % S, m = std::min(end - x, S - i);
          ASSERT_TRUE(alloc.EnsureCapacity(&tables[b], i + m));
          batch.push_back(SeqForward{nullptr, m, i, tables[b].data(), static_cast<int64_t>(tables[b].size())});
          x += m;
        }
        ASSERT_TRUE(runner->RunLayersChunked(first, n, batch, pos.data() + r, h.data() + r * D).ok());
        r = end;
      }
      for (int64_t i = 0; i < B * S * D; ++i) {
        ASSERT_NEAR(h[i], whole[i], 1e-4f * (1 + std::fabs(whole[i]))) << "chunk " << chunk << ", element " << i;
      }
      // Each row's computation does not depend on the chunking: bit-identical.
      if (one_chunk.empty()) one_chunk = h;
      EXPECT_EQ(h, one_chunk) << "chunk " << chunk;
    }
  }
}

// Records what the engine streams.
class RecordingSink : public GenerationSink {
 public:
  bool IsCancelled() override { return cancel.load(); }
  bool OnToken(int32_t t, const TokenLogprobs* lp) override {
    tokens.push_back(t);
    if (lp != nullptr) logprobs.push_back(*lp);
    count.fetch_add(1);
    const int after = cancel_after.load();
    if (after > 0 && static_cast<int>(tokens.size()) >= after) cancel.store(true);
    return stop_after == 0 || static_cast<int>(tokens.size()) < stop_after;
  }
  void OnFinish(const absl::Status& s, const GenerationResult& r) override {
    status = s;
    result = r;
    done.Notify();
  }
  std::atomic<bool> cancel{false};
  std::atomic<int> count{0};
  std::atomic<int> cancel_after{0};  // > 0: cancels itself at this many tokens (may be set while it runs)
  int stop_after = 0;                // > 0: OnToken asks to stop at this many tokens
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  absl::Status status;
  GenerationResult result;
  absl::Notification done;
};

GenerationRequest Req(std::vector<int32_t> prompt, int64_t n, float temperature = 0.0f, uint64_t seed = 0) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.sampling.temperature = temperature;
  r.sampling.top_k = 50;
  r.sampling.seed = seed;
  return r;
}

std::vector<int32_t> RunAlone(GenerationRequest r, EngineOptions o = {}) {
  auto engine = *Engine::Create(TinyRunner(), nullptr, o);
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_TRUE(engine->Submit(std::move(r), sink).ok());
  sink->done.WaitForNotification();
  EXPECT_TRUE(sink->status.ok()) << sink->status;
  return sink->tokens;
}

// Submits every request at once to `engine`; each must get exactly the
// tokens it gets alone.
void ExpectTokensAsAlone(Engine& engine, const std::vector<GenerationRequest>& reqs,
                         const std::vector<std::vector<int32_t>>& alone, const std::string& what) {
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const auto& r : reqs) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(engine.Submit(r, sinks.back()).ok());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    sinks[i]->done.WaitForNotification();
    EXPECT_TRUE(sinks[i]->status.ok()) << sinks[i]->status;
    EXPECT_EQ(sinks[i]->tokens, alone[i]) << "request " << i << ", " << what;
    EXPECT_EQ(sinks[i]->result.prompt_tokens, static_cast<int64_t>(reqs[i].prompt.size()));
  }
}

TEST(EngineTest, GeneratesWithStats) {
  auto engine = *Engine::Create(TinyRunner(), nullptr, {});
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Req({1, 2, 3}, 7), sink).ok());
  sink->done.WaitForNotification();
  ASSERT_TRUE(sink->status.ok()) << sink->status;
  EXPECT_EQ(sink->tokens.size(), 7u);
  EXPECT_EQ(sink->result.prompt_tokens, 3);
  EXPECT_EQ(sink->result.generated_tokens, 7);
  EXPECT_EQ(sink->result.finish_reason, FinishReason::kLength);
  EXPECT_GT(sink->result.time_to_first_token_s, 0);

  // A stop id ends generation right after it is emitted.
  auto stop = std::make_shared<RecordingSink>();
  GenerationRequest r = Req({1, 2, 3}, 7);
  r.stop_token_ids = {sink->tokens[2]};
  ASSERT_TRUE(engine->Submit(std::move(r), stop).ok());
  stop->done.WaitForNotification();
  EXPECT_EQ(stop->result.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stop->tokens.back(), sink->tokens[2]);
  EXPECT_LE(stop->tokens.size(), 3u);
}

// Eos ids end generation with kEos; a sink that returns false ends it with
// kStop right after that token; logprobs never change the tokens, and the
// chosen token's logprob matches the log-softmax of its logits row.
TEST(EngineTest, EosSinkStopAndLogprobs) {
  auto engine = *Engine::Create(TinyRunner(), nullptr, {});
  const std::vector<int32_t> plain = RunAlone(Req({1, 2, 3}, 6));
  ASSERT_EQ(plain.size(), 6u);

  auto eos = std::make_shared<RecordingSink>();
  GenerationRequest r = Req({1, 2, 3}, 6);
  r.eos_token_ids = {plain[3]};
  ASSERT_TRUE(engine->Submit(std::move(r), eos).ok());
  eos->done.WaitForNotification();
  EXPECT_EQ(eos->result.finish_reason, FinishReason::kEos);
  EXPECT_EQ(eos->tokens.back(), plain[3]);

  auto stop = std::make_shared<RecordingSink>();
  stop->stop_after = 2;
  ASSERT_TRUE(engine->Submit(Req({1, 2, 3}, 6), stop).ok());
  stop->done.WaitForNotification();
  EXPECT_EQ(stop->result.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stop->tokens.size(), 2u);
  EXPECT_EQ(stop->result.generated_tokens, 2);

  for (float temperature : {0.0f, 0.8f}) {
    GenerationRequest base = Req({1, 2, 3}, 6, temperature, 7);
    const std::vector<int32_t> want = RunAlone(base);
    auto lp = std::make_shared<RecordingSink>();
    base.top_logprobs = 5;
    ASSERT_TRUE(engine->Submit(base, lp).ok());
    lp->done.WaitForNotification();
    ASSERT_TRUE(lp->status.ok()) << lp->status;
    EXPECT_EQ(lp->tokens, want) << "temperature " << temperature;
    ASSERT_EQ(lp->logprobs.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const TokenLogprobs& p = lp->logprobs[i];
      EXPECT_LE(p.logprob, 0.0f);
      ASSERT_EQ(p.top.size(), 5u);
      for (size_t k = 1; k < p.top.size(); ++k) EXPECT_GE(p.top[k - 1].second, p.top[k].second);
      if (temperature == 0.0f) {
        EXPECT_EQ(p.top[0].first, want[i]);
        EXPECT_FLOAT_EQ(p.top[0].second, p.logprob);
      }
    }
  }
  GenerationRequest bad = Req({1}, 2);
  bad.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_EQ(engine->Submit(std::move(bad), stop).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, LogprobsAreLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  TokenLogprobs p;
  ComputeLogprobs(logits.data(), 5, 4, 3, &p);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(p.logprob, 0.5 - std::log(z), 1e-6);
  ASSERT_EQ(p.top.size(), 3u);
  EXPECT_EQ(p.top[0].first, 1);  // tie: lower id first
  EXPECT_EQ(p.top[1].first, 2);
  EXPECT_EQ(p.top[2].first, 0);
  ComputeLogprobs(logits.data(), 5, 0, 0, &p);
  EXPECT_TRUE(p.top.empty());
}

TEST(EngineTest, RejectsBadRequests) {
  EngineOptions o;
  o.max_new_tokens_limit = 5;
  auto engine = *Engine::Create(TinyRunner(), nullptr, o);
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_EQ(engine->Submit(Req({}, 3), sink).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(engine->Submit(Req({1, 512}, 3), sink).message()).find("prompt_token_ids[1]"),
            std::string::npos);
  EXPECT_EQ(engine->Submit(Req({1}, 0), sink).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(Req({1}, 3, -1.0f), sink).code(), absl::StatusCode::kInvalidArgument);
  // max_new_tokens is capped by the limit.
  ASSERT_TRUE(engine->Submit(Req({1}, 100), sink).ok());
  sink->done.WaitForNotification();
  EXPECT_EQ(sink->tokens.size(), 5u);
}

// Continuous batching must not change any sequence: 8 concurrent requests
// (greedy and sampled, different prompt lengths, arriving while others
// decode) give exactly the tokens each gives alone.
TEST(EngineTest, BatchingDoesNotChangeTokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt;
    for (int j = 0; j <= i * 3; ++j) prompt.push_back((i * 37 + j * 11) % 512);
    reqs.push_back(Req(prompt, 12 + i, i % 2 == 0 ? 0.0f : 0.9f, 100 + i));
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : reqs) alone.push_back(RunAlone(r));

  auto engine = *Engine::Create(TinyRunner(), nullptr, {});
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (size_t i = 0; i < reqs.size(); ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(engine->Submit(reqs[i], sinks.back()).ok());
    if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    sinks[i]->done.WaitForNotification();
    EXPECT_TRUE(sinks[i]->status.ok());
    EXPECT_EQ(sinks[i]->tokens, alone[i]) << "request " << i;
  }
}

// Chunked prefill under a small step budget: long prompts are prefilled a
// few tokens per step beside running decodes, and every sequence still gets
// exactly the tokens it gets alone (the CPU runner's paged prefill of a
// chunk is bit-identical to a whole prompt's). Whole-prompt mode with the
// same small budget still runs the long prompts (alone).
TEST(EngineTest, ChunkedPrefillKeepsTokens) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> prompt;
    const int len = i % 2 == 0 ? 3 + i : 23 + 9 * i;  // short ones decode while long ones prefill
    for (int j = 0; j < len; ++j) prompt.push_back((i * 31 + j * 7) % 512);
    reqs.push_back(Req(prompt, 10, i == 3 ? 0.8f : 0.0f, 50 + i));
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : reqs) alone.push_back(RunAlone(r));
  for (int64_t chunk : {5, 0}) {
    EngineOptions o;
    o.max_batched_tokens = 12;
    o.prefill_chunk_tokens = chunk;
    auto engine = *Engine::Create(TinyRunner(), nullptr, o);
    ExpectTokensAsAlone(*engine, reqs, alone, "chunk " + std::to_string(chunk));
  }
}

// A cache too small for all sequences at once: the newest is preempted and
// recomputed later; every sequence still completes with its own tokens.
TEST(EngineTest, PreemptionUnderASmallCacheKeepsTokens) {
  EngineOptions small;
  small.kv_cache_blocks = 6;
  small.kv_block_size = 8;  // 48 positions for 4 sequences of up to 36
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(Req({static_cast<int32_t>(i + 1), 7, 9, 11}, 32, 0.7f, i));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : reqs) alone.push_back(RunAlone(r));
  auto engine = *Engine::Create(TinyRunner(), nullptr, small);
  ExpectTokensAsAlone(*engine, reqs, alone, "small cache");
}

// Prefix caching: requests sharing a long prefix (a system prompt), one
// after another and concurrently, under a cache small enough to evict, get
// exactly the tokens they get without it, and later ones skip the shared
// blocks' prefill (cached_prompt_tokens).
TEST(EngineTest, PrefixCachingKeepsTokensAndSkipsPrefill) {
  std::vector<int32_t> system;
  for (int j = 0; j < 37; ++j) system.push_back((j * 13 + 5) % 512);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = system;
    for (int j = 0; j <= i; ++j) prompt.push_back((i * 41 + j * 3) % 512);
    reqs.push_back(Req(prompt, 9, i % 2 == 0 ? 0.0f : 0.8f, 70 + i));
  }
  EngineOptions off;
  off.prefix_caching = false;
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : reqs) alone.push_back(RunAlone(r, off));

  EngineOptions o;
  o.kv_block_size = 8;
  o.kv_cache_blocks = 24;
  o.prefill_chunk_tokens = 16;
  Metrics metrics;
  auto engine = *Engine::Create(TinyRunner(), &metrics, o);
  // One after another: the first prefills all 38 tokens, the rest reuse
  // the system prompt's 4 full blocks (32 tokens).
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(engine->Submit(reqs[i], sink).ok());
    sink->done.WaitForNotification();
    ASSERT_TRUE(sink->status.ok()) << sink->status;
    EXPECT_EQ(sink->tokens, alone[i]) << "request " << i;
    EXPECT_EQ(sink->result.cached_prompt_tokens, i == 0 ? 0 : 32) << "request " << i;
  }
  // The same prompt again: everything but the block holding its last token.
  auto again = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(reqs[5], again).ok());
  again->done.WaitForNotification();
  EXPECT_EQ(again->tokens, alone[5]);
  EXPECT_EQ(again->result.cached_prompt_tokens, 40);
  // Cancelled mid-stream while sharing the cached prefix: its references go,
  // so nothing stays held once the engine is idle.
  auto cancelled = std::make_shared<RecordingSink>();
  cancelled->cancel_after = 2;
  GenerationRequest long_one = reqs[4];
  long_one.max_new_tokens = 200;
  ASSERT_TRUE(engine->Submit(long_one, cancelled).ok());
  cancelled->done.WaitForNotification();
  EXPECT_EQ(cancelled->status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancelled->result.cached_prompt_tokens, 40);  // reqs[4] ran before: 5 of its blocks
  for (int i = 0; i < 200 && metrics.kv_cache_blocks_used().Value() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(metrics.kv_cache_blocks_used().Value(), 0);
  EXPECT_EQ(metrics.kv_cache_blocks_shared().Value(), 0);
  EXPECT_GT(metrics.kv_cache_blocks_cached().Value(), 0);  // the prefix stays for the next request
  EXPECT_EQ(metrics.prefix_cache_hit_tokens().Value(), 5 * 32 + 40 + 40);
  // Concurrently, with preemption and eviction in a small cache.
  EngineOptions small = o;
  small.kv_cache_blocks = 14;
  auto tight = *Engine::Create(TinyRunner(), nullptr, small);
  ExpectTokensAsAlone(*tight, reqs, alone, "prefix caching, small cache");
}

TEST(EngineTest, QueueLimitAndCancellation) {
  Metrics metrics;
  EngineOptions o;
  o.max_running = 1;
  o.max_waiting = 1;
  auto engine = *Engine::Create(TinyRunner(), &metrics, o);
  auto first = std::make_shared<RecordingSink>();
  auto second = std::make_shared<RecordingSink>();
  auto third = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Req({1, 2}, 4000), first).ok());
  // Once first runs, second waits (max_running 1) and fills the queue (1).
  while (first->count.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  ASSERT_TRUE(engine->Submit(Req({3, 4}, 4000), second).ok());
  EXPECT_EQ(engine->Submit(Req({5}, 4), third).code(), absl::StatusCode::kResourceExhausted);
  // Only now does first cancel itself mid-stream, 50 tokens on: cancelling
  // before the submits above would free its slot (second runs, the queue
  // empties, third is taken): 46 of 200 repeated runs on the 2-core machine.
  first->cancel_after.store(first->count.load() + 50);
  first->done.WaitForNotification();
  EXPECT_EQ(first->status.code(), absl::StatusCode::kCancelled);
  EXPECT_GE(first->tokens.size(), 50u);
  second->cancel.store(true);
  engine->Wake();
  second->done.WaitForNotification();
  EXPECT_EQ(second->status.code(), absl::StatusCode::kCancelled);
  // Every block is back.
  for (int i = 0; i < 100 && metrics.kv_cache_blocks_used().Value() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(metrics.kv_cache_blocks_used().Value(), 0);
  EXPECT_GT(metrics.kv_cache_blocks_total().Value(), 0);
}

// A runner that runs TransformerBlock only whole (as the CUDA runner does).
class WholeBlocksRunner : public ModelRunner {
 public:
  explicit WholeBlocksRunner(std::unique_ptr<ModelRunner> r) : r_(std::move(r)) {}
  const ModelConfig& config() const override { return r_->config(); }
  std::string device() const override { return "whole"; }
  absl::Status InitKvCache(int64_t num_blocks, int64_t block_size) override {
    return r_->InitKvCache(num_blocks, block_size);
  }
  absl::Status Forward(const std::vector<SeqForward>& batch, ForwardOutput* out) override {
    return r_->Forward(batch, out);
  }
  absl::Status RunLayers(int64_t first, int64_t n, int64_t B, int64_t S, const int64_t* positions,
                         float* hidden) override {
    layer_calls.fetch_add(1);
    return r_->RunLayers(first, n, B, S, positions, hidden);
  }
  std::atomic<int> layer_calls{0};

 private:
  std::unique_ptr<ModelRunner> r_;
};

BlockTask MakeBlock(int64_t B, int64_t S, uint32_t seed, std::shared_ptr<absl::StatusOr<std::vector<float>>> out,
                    std::shared_ptr<absl::Notification> done) {
  BlockTask t;
  t.num_layers = 2;
  t.batch = B;
  t.seq_len = S;
  t.hidden.resize(B * S * 64);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (float& v : t.hidden) v = dist(gen);
  for (int64_t i = 0; i < B * S; ++i) t.positions.push_back(i % S);
  t.done = [out, done](absl::StatusOr<std::vector<float>> r) {
    *out = std::move(r);
    done->Notify();
  };
  return t;
}

// The engine runs block calls in pieces between decode steps (row chunks
// through lent KV blocks, or a layer per step for a whole-only runner): the
// same hidden states as RunLayers, the stream unchanged, every block back.
TEST(EngineTest, BlockCallsInPiecesMatchWholeRunLayers) {
  for (bool whole_only : {false, true}) {
    SCOPED_TRACE(whole_only ? "whole-only runner" : "chunked runner");
    Metrics metrics;
    EngineOptions o;
    o.prefill_chunk_tokens = 7;
    o.kv_block_size = 4;
    o.kv_cache_blocks = 12;  // a block sequence of 40 needs 10, the stream up to 10: they compete
    o.max_block_tokens = 200;
    std::unique_ptr<ModelRunner> runner = TinyRunner();
    WholeBlocksRunner* whole = nullptr;
    if (whole_only) {
      auto w = std::make_unique<WholeBlocksRunner>(std::move(runner));
      whole = w.get();
      runner = std::move(w);
    }
    auto engine = *Engine::Create(std::move(runner), &metrics, o);
    std::vector<int32_t> prompt(30);
    std::iota(prompt.begin(), prompt.end(), 7);
    const std::vector<int32_t> alone = RunAlone(Req(prompt, 10), o);
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(engine->Submit(Req(prompt, 10), sink).ok());
    // The stream holds 8 blocks when the block call starts: its first
    // sequence gets what is left, waits, and the stream is preempted.
    while (sink->count.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    auto out = std::make_shared<absl::StatusOr<std::vector<float>>>();
    auto done = std::make_shared<absl::Notification>();
    BlockTask task = MakeBlock(3, 40, 9, out, done);
    std::vector<float> want = task.hidden;
    std::vector<int64_t> pos = task.positions;
    ASSERT_TRUE(engine->SubmitBlock(std::move(task)).ok());
    done->WaitForNotification();
    sink->done.WaitForNotification();
    ASSERT_TRUE(out->ok()) << out->status();
    auto ref = TinyRunner();
    ASSERT_TRUE(ref->RunLayers(0, 2, 3, 40, pos.data(), want.data()).ok());
    ASSERT_EQ((*out)->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR((**out)[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << "element " << i;
    }
    EXPECT_EQ(sink->tokens, alone);
    if (whole != nullptr) {
      EXPECT_EQ(whole->layer_calls.load(), 2);  // one layer per step
    }
    for (int i = 0; i < 100 && metrics.kv_cache_blocks_used().Value() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(metrics.kv_cache_blocks_used().Value(), 0);
  }
}

TEST(EngineTest, BlockCallLimitsAndCancellation) {
  EngineOptions o;
  o.max_block_tokens = 100;
  o.prefill_chunk_tokens = 4;
  auto engine = *Engine::Create(TinyRunner(), nullptr, o);
  auto out = std::make_shared<absl::StatusOr<std::vector<float>>>();
  auto done = std::make_shared<absl::Notification>();
  absl::Status s = engine->SubmitBlock(MakeBlock(2, 51, 1, out, done));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--max_block_tokens=100"), std::string::npos) << s;
  EXPECT_FALSE(done->HasBeenNotified());
  // Cancelled after its first chunk: it stops there.
  auto chunks = std::make_shared<std::atomic<int>>(0);
  BlockTask t = MakeBlock(1, 100, 1, out, done);
  t.cancelled = [chunks] { return chunks->fetch_add(1) >= 1; };
  ASSERT_TRUE(engine->SubmitBlock(std::move(t)).ok());
  done->WaitForNotification();
  EXPECT_EQ(out->status().code(), absl::StatusCode::kCancelled);
  EXPECT_LE(chunks->load(), 3);
  // Past its deadline: DEADLINE_EXCEEDED, not CANCELLED.
  auto out2 = std::make_shared<absl::StatusOr<std::vector<float>>>();
  auto done2 = std::make_shared<absl::Notification>();
  BlockTask late = MakeBlock(1, 8, 1, out2, done2);
  late.deadline = absl::Now() - absl::Seconds(1);
  late.cancelled = [] { return true; };
  ASSERT_TRUE(engine->SubmitBlock(std::move(late)).ok());
  done2->WaitForNotification();
  EXPECT_EQ(out2->status().code(), absl::StatusCode::kDeadlineExceeded);
}

// Queued block calls are bounded in bytes too: ten calls of ~26 KB (100 x 64
// floats + positions) submitted at once against a 30 KB bound: the first is
// always queued, later ones are refused while it (or another) waits.
TEST(EngineTest, QueuedBlockBytesAreBounded) {
  EngineOptions o;
  o.prefill_chunk_tokens = 1;  // many pieces: the first call stays busy while the rest are submitted
  o.max_queued_block_bytes = 30000;
  auto engine = *Engine::Create(TinyRunner(), nullptr, o);
  std::vector<std::shared_ptr<absl::Notification>> accepted;
  int refused = 0;
  for (int i = 0; i < 10; ++i) {
    auto out = std::make_shared<absl::StatusOr<std::vector<float>>>();
    auto done = std::make_shared<absl::Notification>();
    absl::Status s = engine->SubmitBlock(MakeBlock(1, 100, i, out, done));
    if (s.ok()) {
      accepted.push_back(done);
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
      EXPECT_NE(s.message().find("--max_queued_bytes"), std::string::npos) << s;
      ++refused;
    }
  }
  EXPECT_GE(refused, 1);
  EXPECT_GE(accepted.size(), 1u);
  for (auto& done : accepted) done->WaitForNotification();
}

TEST(EngineTest, ShutdownFailsPendingRequests) {
  EngineOptions o;
  o.max_running = 1;
  auto engine = *Engine::Create(TinyRunner(), nullptr, o);
  auto a = std::make_shared<RecordingSink>(), b = std::make_shared<RecordingSink>();
  ASSERT_TRUE(engine->Submit(Req({1}, 4000), a).ok());
  ASSERT_TRUE(engine->Submit(Req({2}, 4000), b).ok());
  engine->Shutdown();
  EXPECT_TRUE(a->done.HasBeenNotified());
  EXPECT_TRUE(b->done.HasBeenNotified());
  EXPECT_EQ(b->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine->Submit(Req({1}, 1), a).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace fusedserve
