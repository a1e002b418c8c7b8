// End-to-end tests of Generate and TransformerBlock on the default tiny model
// (CPU, random weights from --seed): real server process, real gRPC streams,
// the /metrics scrape.
#include <atomic>
#include <chrono>
#include <regex>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/tensor.h"
#include "server/validation.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::HttpGet;
using testing::ServerProcess;

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::GenerationStats stats;
  bool has_stats = false;
};

v1::GenerateRequest MakeRequest(std::vector<int32_t> prompt, int max_new, float temperature = 0, uint64_t seed = 0) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.add_prompt_token_ids(t);
  r.set_max_new_tokens(max_new);
  r.set_temperature(temperature);
  r.set_top_k(temperature > 0 ? 40 : 0);
  r.set_seed(seed);
  return r;
}

StreamResult Generate(ServerProcess* server, const v1::GenerateRequest& req, double timeout_s = 60) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
  auto stub = server->stub();
  auto reader = stub->Generate(&ctx, req);
  StreamResult out;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    out.tokens.insert(out.tokens.end(), resp.token_ids().begin(), resp.token_ids().end());
    if (resp.has_stats()) {
      out.stats = resp.stats();
      out.has_stats = true;
    }
  }
  out.status = reader->Finish();
  return out;
}

// Value of an unlabelled gauge/counter in a Prometheus text scrape (-1 if absent).
double Scrape(int port, const std::string& name) {
  const std::string body = HttpGet(port, "/metrics");
  std::smatch m;
  if (std::regex_search(body, m, std::regex("\n" + name + " ([0-9.e+-]+)"))) return std::stod(m[1]);
  return -1;
}

class GenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = ServerProcess::Start({"--seed=11"}).release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }
  static ServerProcess* server_;
};
ServerProcess* GenerateTest::server_ = nullptr;

TEST_F(GenerateTest, ServerInfoDescribesTheModel) {
  grpc::ClientContext ctx;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(server_->stub()->GetServerInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.model().name(), "tiny");
  EXPECT_EQ(info.model().hidden_size(), 64);
  EXPECT_EQ(info.model().num_layers(), 2);
  EXPECT_EQ(info.model().num_q_heads(), 4);
  EXPECT_EQ(info.model().num_kv_heads(), 2);
  EXPECT_EQ(info.model().vocab_size(), 512);
}

TEST_F(GenerateTest, GreedyGeneratesWithStats) {
  StreamResult r = Generate(server_, MakeRequest({1, 2, 3, 4}, 16));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens.size(), 16u);
  for (int32_t t : r.tokens) EXPECT_TRUE(t >= 0 && t < 512) << t;
  ASSERT_TRUE(r.has_stats);
  EXPECT_EQ(r.stats.prompt_tokens(), 4);
  EXPECT_EQ(r.stats.generated_tokens(), 16);
  EXPECT_EQ(r.stats.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_GT(r.stats.time_to_first_token_seconds(), 0);
  EXPECT_GT(r.stats.time_per_output_token_seconds(), 0);
  // Greedy is deterministic.
  EXPECT_EQ(Generate(server_, MakeRequest({1, 2, 3, 4}, 16)).tokens, r.tokens);

  // A stop id ends the stream with FINISH_REASON_STOP right after it.
  v1::GenerateRequest stop = MakeRequest({1, 2, 3, 4}, 16);
  stop.add_stop_token_ids(r.tokens[5]);
  StreamResult s = Generate(server_, stop);
  ASSERT_TRUE(s.status.ok());
  EXPECT_EQ(s.stats.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(s.tokens.back(), r.tokens[5]);
}

// Prefix caching (on by default): a prompt that starts like an earlier one
// reuses its full KV blocks (16 positions each): the same tokens, the
// reused count in the stats and in fusedserve_prefix_cache_hit_tokens_total.
TEST_F(GenerateTest, PrefixCacheReusesEarlierPrompts) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 29 + 3) % 512);
  const double hits_before = Scrape(server_->metrics_port(), "fusedserve_prefix_cache_hit_tokens_total");
  StreamResult first = Generate(server_, MakeRequest(prompt, 8));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  StreamResult second = Generate(server_, MakeRequest(prompt, 8));
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.stats.cached_prompt_tokens(), 32);  // 2 of the prompt's 3 blocks (the last is computed)
  EXPECT_EQ(second.stats.prompt_tokens(), 40);
  EXPECT_GE(Scrape(server_->metrics_port(), "fusedserve_prefix_cache_hit_tokens_total") - hits_before, 32);
}

TEST_F(GenerateTest, SameSeedSameTokens) {
  const v1::GenerateRequest req = MakeRequest({7, 8, 9}, 24, 0.9f, 1234);
  StreamResult a = Generate(server_, req), b = Generate(server_, req);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.tokens, b.tokens);
  StreamResult c = Generate(server_, MakeRequest({7, 8, 9}, 24, 0.9f, 999));
  EXPECT_NE(a.tokens, c.tokens);  // 24 sampled tokens from 512: equal only by accident
}

TEST_F(GenerateTest, EightConcurrentStreamsComplete) {
  std::vector<StreamResult> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Generate(server_, MakeRequest({i + 1, 2 * i + 3}, 20 + i, i % 2 ? 0.8f : 0.0f, i));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(20 + i));
    // Batched with the others or alone: the same tokens.
    EXPECT_EQ(results[i].tokens,
              Generate(server_, MakeRequest({i + 1, 2 * i + 3}, 20 + i, i % 2 ? 0.8f : 0.0f, i)).tokens);
  }
}

// --tensor_parallel=2: the CPU backend holds and runs the model as two
// Megatron shards; greedy tokens equal the unsharded server's (GenerateTest's
// server, same --seed).
TEST_F(GenerateTest, TensorParallelServerGeneratesTheSameTokens) {
  std::unique_ptr<ServerProcess> tp = ServerProcess::Start({"--seed=11", "--tensor_parallel=2"});
  ASSERT_NE(tp, nullptr);
  for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{1, 2, 3, 4, 5}, std::vector<int32_t>{70, 9, 33}}) {
    const v1::GenerateRequest req = MakeRequest(prompt, 24);
    const StreamResult a = Generate(server_, req), b = Generate(tp.get(), req);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    ASSERT_TRUE(b.status.ok()) << b.status.error_message();
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(b.tokens.size(), 24u);
  }
}

// A split the model does not allow (its kv heads do not divide by 3) stops
// the server at start with the flag named.
TEST(TensorParallelFlagTest, BadSplitIsRefusedAtStart) {
  std::unique_ptr<ServerProcess> p = ServerProcess::Spawn({"--seed=11", "--tensor_parallel=3"});
  const int code = p->WaitExit(60);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1) << "still running";
  EXPECT_NE(p->Log().find("--tensor_parallel=3"), std::string::npos) << p->Log();
}

TEST_F(GenerateTest, RejectsBadRequests) {
  StreamResult r = Generate(server_, MakeRequest({}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("prompt"), std::string::npos);
  r = Generate(server_, MakeRequest({1, 9999}, 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("prompt_token_ids[1]"), std::string::npos);
  v1::GenerateRequest bad_p = MakeRequest({1}, 4, 1.0f);
  bad_p.set_top_p(1.5f);
  EXPECT_EQ(Generate(server_, bad_p).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

v1::TransformerBlockRequest BlockRequest(int64_t B, int64_t S, int64_t D, int first, int n) {
  std::vector<float> v(B * S * D);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f;
  v1::TransformerBlockRequest req;
  TensorToProto(HostTensor::FromFloat(DType::kF32, {B, S, D}, v), req.mutable_hidden());
  req.set_first_layer(first);
  req.set_num_layers(n);
  return req;
}

grpc::Status Block(ServerProcess* server, const v1::TransformerBlockRequest& req, v1::TransformerBlockResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return server->stub()->TransformerBlock(&ctx, req, resp);
}

TEST_F(GenerateTest, TransformerBlockRunsLayers) {
  v1::TransformerBlockResponse all, first, second;
  ASSERT_TRUE(Block(server_, BlockRequest(2, 5, 64, 0, 0), &all).ok());
  EXPECT_EQ(all.hidden().dtype(), v1::F32);
  ASSERT_EQ(all.hidden().shape_size(), 3);
  EXPECT_EQ(all.hidden().shape(0), 2);
  EXPECT_EQ(all.hidden().shape(1), 5);
  EXPECT_EQ(all.hidden().shape(2), 64);
  // Layer 0 then layer 1 equals layers [0, 2) at once.
  ASSERT_TRUE(Block(server_, BlockRequest(2, 5, 64, 0, 1), &first).ok());
  v1::TransformerBlockRequest next = BlockRequest(2, 5, 64, 1, 1);
  *next.mutable_hidden() = first.hidden();
  ASSERT_TRUE(Block(server_, next, &second).ok());
  EXPECT_EQ(second.hidden().data(), all.hidden().data());
  // Explicit default positions change nothing; shifted positions change the output.
  v1::TransformerBlockRequest with_pos = BlockRequest(2, 5, 64, 0, 0);
  std::vector<int64_t> pos;
  for (int b = 0; b < 2; ++b) {
    for (int s = 0; s < 5; ++s) pos.push_back(s);
  }
  TensorToProto(HostTensor::FromInt64(DType::kI64, {2, 5}, pos), with_pos.mutable_positions());
  v1::TransformerBlockResponse r;
  ASSERT_TRUE(Block(server_, with_pos, &r).ok());
  EXPECT_EQ(r.hidden().data(), all.hidden().data());
  for (int64_t& p : pos) p += 100;
  with_pos.clear_positions();
  TensorToProto(HostTensor::FromInt64(DType::kI64, {2, 5}, pos), with_pos.mutable_positions());
  grpc::Status shifted = Block(server_, with_pos, &r);
  ASSERT_TRUE(shifted.ok()) << shifted.error_code() << " " << shifted.error_message();
  EXPECT_NE(r.hidden().data(), all.hidden().data());
  // BF16 in, BF16 out.
  v1::TransformerBlockRequest bf = BlockRequest(1, 3, 64, 0, 0);
  bf.clear_hidden();
  HostTensor h = HostTensor::FromFloat(DType::kBF16, {1, 3, 64}, std::vector<float>(192, 0.25f));
  TensorToProto(h, bf.mutable_hidden());
  ASSERT_TRUE(Block(server_, bf, &r).ok());
  EXPECT_EQ(r.hidden().dtype(), v1::BF16);
  EXPECT_EQ(r.hidden().data().size(), 192u * 2);
}

TEST_F(GenerateTest, TransformerBlockShapeErrors) {
  struct Case {
    v1::TransformerBlockRequest req;
    std::string expect;
  };
  std::vector<Case> cases;
  cases.push_back({BlockRequest(1, 4, 32, 0, 0), "hidden size 64"});
  cases.push_back({BlockRequest(1, 4, 64, 2, 0), "first_layer"});
  cases.push_back({BlockRequest(1, 4, 64, -1, 0), "first_layer"});
  cases.push_back({BlockRequest(1, 4, 64, 1, 2), "exceeds"});
  cases.push_back({BlockRequest(1, 4, 64, 0, -1), "num_layers"});
  v1::TransformerBlockRequest rank2;
  TensorToProto(HostTensor::FromFloat(DType::kF32, {4, 64}, std::vector<float>(256)), rank2.mutable_hidden());
  cases.push_back({rank2, "rank 3"});
  v1::TransformerBlockRequest ints;
  TensorToProto(HostTensor::FromInt64(DType::kI32, {1, 1, 64}, std::vector<int64_t>(64)), ints.mutable_hidden());
  cases.push_back({ints, "dtype"});
  cases.push_back({v1::TransformerBlockRequest(), "hidden"});
  v1::TransformerBlockRequest bad_pos = BlockRequest(1, 4, 64, 0, 0);
  TensorToProto(HostTensor::FromInt64(DType::kI64, {1, 3}, {0, 1, 2}), bad_pos.mutable_positions());
  cases.push_back({bad_pos, "positions"});
  v1::TransformerBlockRequest short_data = BlockRequest(1, 4, 64, 0, 0);
  short_data.mutable_hidden()->mutable_data()->resize(10);
  cases.push_back({short_data, "hidden"});
  for (const Case& c : cases) {
    v1::TransformerBlockResponse resp;
    grpc::Status s = Block(server_, c.req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.expect << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.expect), std::string::npos) << s.error_message();
  }
}

// Reads `n` tokens of a stream, then cancels it.
void ReadThenCancel(ServerProcess* server, const v1::GenerateRequest& req, int n, grpc::Status* status) {
  grpc::ClientContext ctx;
  auto stub = server->stub();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int got = 0;
  while (got < n && reader->Read(&resp)) got += resp.token_ids_size();
  ctx.TryCancel();
  while (reader->Read(&resp)) {
  }
  *status = reader->Finish();
}

// A server with one running slot and a one-request queue.
class GenerateLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = ServerProcess::Start(
        {"--max_running=1", "--max_waiting=1", "--max_new_tokens_limit=100000", "--max_seq_len=8192"});
    ASSERT_NE(server_, nullptr);
  }
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(GenerateLimitsTest, CancelMidStreamFreesTheSlot) {
  EXPECT_GT(Scrape(server_->metrics_port(), "fusedserve_kv_cache_blocks_total"), 0);
  grpc::Status s;
  ReadThenCancel(server_.get(), MakeRequest({1, 2, 3}, 8000), 5, &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  // The sequence leaves at the next step: blocks and the running slot return.
  double used = -1, running = -1;
  for (int i = 0; i < 200; ++i) {
    used = Scrape(server_->metrics_port(), "fusedserve_kv_cache_blocks_used");
    running = Scrape(server_->metrics_port(), "fusedserve_requests_running");
    if (used == 0 && running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(used, 0);
  EXPECT_EQ(running, 0);
  // The only slot is free again: a new request completes.
  StreamResult r = Generate(server_.get(), MakeRequest({4, 5}, 8));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 8u);
}

TEST_F(GenerateLimitsTest, FullQueueIsResourceExhausted) {
  // A long stream holds the running slot; its first token proves it runs.
  grpc::ClientContext ctx1;
  auto stub = server_->stub();
  auto running = stub->Generate(&ctx1, MakeRequest({1, 2}, 8000));
  v1::GenerateResponse resp;
  ASSERT_TRUE(running->Read(&resp));
  // A second one waits in the queue (its stream stays open, no tokens yet).
  grpc::ClientContext ctx2;
  auto waiting = stub->Generate(&ctx2, MakeRequest({3, 4}, 8));
  // Give the server a moment to queue it, then the third finds the queue full.
  double queued = 0;
  for (int i = 0; i < 100 && queued < 1; ++i) {
    queued = Scrape(server_->metrics_port(), "fusedserve_requests_waiting");
    if (queued < 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(queued, 1);
  StreamResult third = Generate(server_.get(), MakeRequest({5}, 4));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.status.error_message();
  EXPECT_NE(third.status.error_message().find("queue"), std::string::npos);
  // Cancelling the long one lets the waiting one run to completion.
  ctx1.TryCancel();
  while (running->Read(&resp)) {
  }
  EXPECT_EQ(running->Finish().error_code(), grpc::StatusCode::CANCELLED);
  int tokens = 0;
  while (waiting->Read(&resp)) tokens += resp.token_ids_size();
  EXPECT_TRUE(waiting->Finish().ok());
  EXPECT_EQ(tokens, 8);
}

TEST_F(GenerateLimitsTest, DeadlineStopsTheSequence) {
  StreamResult r = Generate(server_.get(), MakeRequest({1}, 8000), /*timeout_s=*/0.3);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  double used = -1;
  for (int i = 0; i < 200 && used != 0; ++i) {
    used = Scrape(server_->metrics_port(), "fusedserve_kv_cache_blocks_used");
    if (used != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(used, 0);
}

}  // namespace
}  // namespace fusedserve
