// Tensor parallelism without GPUs: the CPU runner holding the model as N
// Megatron shards (column-parallel q/k/v and gate/up, row-parallel o_proj
// and down_proj added in rank order, vocab-parallel embeddings and lm_head,
// each rank its kv heads' slice of the paged cache) must compute what the
// unsharded runner computes: logits through prefill, chunked prefill and
// decode, TransformerBlock layers, and the engine's greedy tokens.
#include "model/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/notification.h"
#include "engine/engine.h"
#include "model/runner.h"
#include "model/weights.h"

namespace fusedserve {
namespace {

// GQA 8:4, an intermediate size and a vocabulary that 4 ranks split unevenly.
ModelConfig ShardableConfig(bool tied) {
  ModelConfig c = *PresetConfig("tiny");
  c.hidden = 64;
  c.q_heads = 8;
  c.kv_heads = 4;
  c.head_dim = 8;
  c.intermediate = 96;
  c.vocab = 509;
  c.tied_embeddings = tied;
  return c;
}

std::unique_ptr<ModelRunner> Runner(const ModelConfig& c, int tp) {
  auto r = MakeCpuModelRunner(ModelWeights::Random(c, 17), 1, tp);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  EXPECT_TRUE((*r)->InitKvCache(64, 4).ok());
  return *std::move(r);
}

double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

TEST(TensorParallelTest, ShardRanges) {
  const ModelConfig c = ShardableConfig(false);
  int64_t vocab = 0;
  for (int r = 0; r < 4; ++r) {
    const TensorShard s = *ShardOf(c, r, 4);
    EXPECT_EQ(s.kv_heads, 1);
    EXPECT_EQ(s.q_heads, 2);
    EXPECT_EQ(s.q_head_begin, 2 * r);
    EXPECT_EQ(s.inter, 24);
    EXPECT_EQ(s.vocab_begin, vocab);
    vocab += s.vocab;
  }
  EXPECT_EQ(vocab, 509);  // 128 + 128 + 128 + 125
  EXPECT_EQ(ShardOf(c, 3, 4)->vocab, 125);
  // kv heads must split whole; the error names the flag.
  absl::StatusOr<TensorShard> bad = ShardOf(c, 0, 3);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("--tensor_parallel=3"), std::string::npos);
  EXPECT_FALSE(MakeCpuModelRunner(ModelWeights::Random(c, 1), 1, 8).ok());  // 4 kv heads over 8 ranks
}

// Prompts of several lengths, one of them in two chunks, then decodes: each
// step's logits at N = 2 and 4 against N = 1 (fp32; only the order of the
// partial sums differs).
TEST(TensorParallelTest, ForwardMatchesUnsharded) {
  for (bool tied : {false, true}) {
    const ModelConfig c = ShardableConfig(tied);
    auto one = Runner(c, 1);
    for (int tp : {2, 4}) {
      auto many = Runner(c, tp);
      ASSERT_TRUE(one && many);
      std::mt19937 rng(5);
      std::vector<std::vector<int32_t>> tokens = {{}, {}, {}};
      const std::vector<int64_t> lens = {1, 7, 13};
      std::vector<std::vector<int32_t>> tables = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
      for (size_t i = 0; i < lens.size(); ++i) {
        for (int64_t t = 0; t < lens[i]; ++t) tokens[i].push_back(static_cast<int32_t>(rng() % c.vocab));
      }
      std::vector<int64_t> cached = {0, 0, 0};
      for (int step = 0; step < 4; ++step) {
        std::vector<SeqForward> batch;
        for (size_t i = 0; i < lens.size(); ++i) {
          SeqForward f;
          f.start = cached[i];
          f.tokens = tokens[i].data() + cached[i];
          // The longest prompt runs in two chunks (6, then 7).
          f.num_tokens = i == 2 && step == 0 ? 6 : static_cast<int64_t>(tokens[i].size()) - cached[i];
          f.block_table = tables[i].data();
          f.num_blocks = 4;
          batch.push_back(f);
        }
        std::vector<float> want, got;
        ASSERT_TRUE(one->ForwardLogits(batch, &want).ok());
        ASSERT_TRUE(many->ForwardLogits(batch, &got).ok());
        EXPECT_LT(RelError(got, want), 1e-5) << "tp " << tp << " step " << step << " tied " << tied;
        for (size_t i = 0; i < lens.size(); ++i) {
          cached[i] += batch[i].num_tokens;
          if (cached[i] == static_cast<int64_t>(tokens[i].size())) {
            tokens[i].push_back(static_cast<int32_t>(rng() % c.vocab));
          }
        }
      }
    }
  }
}

TEST(TensorParallelTest, TransformerBlockLayersMatchUnsharded) {
  const ModelConfig c = ShardableConfig(false);
  auto one = Runner(c, 1);
  auto two = Runner(c, 2);
  ASSERT_TRUE(one && two);
  const int64_t B = 2, S = 5;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> hidden(B * S * c.hidden);
  for (float& v : hidden) v = nd(rng);
  std::vector<int64_t> positions(B * S);
  for (int64_t i = 0; i < B * S; ++i) positions[i] = i % S;
  std::vector<float> want = hidden, got = hidden;
  ASSERT_TRUE(one->RunLayers(0, c.layers, B, S, positions.data(), want.data()).ok());
  ASSERT_TRUE(two->RunLayers(0, c.layers, B, S, positions.data(), got.data()).ok());
  EXPECT_LT(RelError(got, want), 1e-5);
}

class Collect : public GenerationSink {
 public:
  bool IsCancelled() override { return false; }
  bool OnToken(int32_t t, const TokenLogprobs*) override {
    tokens.push_back(t);
    return true;
  }
  void OnFinish(const absl::Status& s, const GenerationResult&) override {
    status = s;
    done.Notify();
  }
  std::vector<int32_t> tokens;
  absl::Status status;
  absl::Notification done;
};

// Greedy generation through the engine: the same tokens at N = 1, 2, 4.
TEST(TensorParallelTest, EngineGreedyTokensMatch) {
  const ModelConfig c = ShardableConfig(false);
  std::vector<std::vector<int32_t>> results;
  for (int tp : {1, 2, 4}) {
    auto runner = MakeCpuModelRunner(ModelWeights::Random(c, 23), 1, tp);
    ASSERT_TRUE(runner.ok());
    auto engine = Engine::Create(*std::move(runner), nullptr, {});
    ASSERT_TRUE(engine.ok());
    GenerationRequest r;
    r.prompt = {3, 141, 59, 26, 5, 358, 97};
    r.max_new_tokens = 24;
    auto sink = std::make_shared<Collect>();
    ASSERT_TRUE((*engine)->Submit(r, sink).ok());
    sink->done.WaitForNotification();
    ASSERT_TRUE(sink->status.ok()) << sink->status;
    results.push_back(sink->tokens);
  }
  EXPECT_EQ(results[1], results[0]);
  EXPECT_EQ(results[2], results[0]);
}

}  // namespace
}  // namespace fusedserve
