// TransformerBlock next to Generate on the real server (CPU, tiny model): a
// large block call is cut into chunks between decode steps, so a running
// stream keeps its per-token latency; the per-request bound, deadlines, NaN
// input, and the code a Generate deadline is recorded with.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "kernels/tensor.h"
#include "model/config.h"
#include "model/runner.h"
#include "server/validation.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::HttpGet;
using testing::ServerProcess;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSeed = 11;
constexpr int64_t kD = 64;  // the tiny model's hidden size

std::vector<float> BlockInput(int64_t B, int64_t S) {
  std::vector<float> v(B * S * kD);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f;
  return v;
}

v1::TransformerBlockRequest BlockRequest(int64_t B, int64_t S, const std::vector<float>& v) {
  v1::TransformerBlockRequest req;
  TensorToProto(HostTensor::FromFloat(DType::kF32, {B, S, kD}, v), req.mutable_hidden());
  return req;  // all layers, positions 0..S-1
}

grpc::Status Block(ServerProcess* server, const v1::TransformerBlockRequest& req, v1::TransformerBlockResponse* resp,
                   double timeout_s = 120) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
  return server->stub()->TransformerBlock(&ctx, req, resp);
}

v1::GenerateRequest GenRequest(int max_new) {
  v1::GenerateRequest r;
  r.add_prompt_token_ids(1);
  r.add_prompt_token_ids(2);
  r.set_max_new_tokens(max_new);
  return r;
}

// fusedserve_requests_total for (rpc, code), whatever the label order (0 if absent).
double RequestsTotal(int metrics_port, const std::string& rpc, const std::string& code) {
  std::istringstream body(HttpGet(metrics_port, "/metrics"));
  double total = 0;
  for (std::string line; std::getline(body, line);) {
    if (line.rfind("fusedserve_requests_total{", 0) != 0) continue;
    if (line.find("rpc=\"" + rpc + "\"") == std::string::npos) continue;
    if (line.find("code=\"" + code + "\"") == std::string::npos) continue;
    total += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return total;
}

class BlockSchedulingTest : public ::testing::Test {
 protected:
  // Chunks of 128 rows: on this model a chunk at the end of an 8192-row
  // sequence is ~0.1 s of CPU; the default 2048 is ~16x that.
  static void SetUpTestSuite() {
    server_ = ServerProcess::Start(
                  {"--seed=" + std::to_string(kSeed), "--prefill_chunk_tokens=128", "--max_new_tokens_limit=100000"})
                  .release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }
  static ServerProcess* server_;
};
ServerProcess* BlockSchedulingTest::server_ = nullptr;

TEST_F(BlockSchedulingTest, LargeBlockCallDoesNotStallAStream) {
  // The largest call the default --max_block_tokens (8192) allows.
  const int64_t S = 8192;
  const std::vector<float> input = BlockInput(1, S);

  grpc::ClientContext gen_ctx;
  auto stub = server_->stub();
  auto reader = stub->Generate(&gen_ctx, GenRequest(100000));
  std::vector<Clock::time_point> reads;  // when each stream message arrived
  std::thread watcher([&] {
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) reads.push_back(Clock::now());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the stream is decoding

  v1::TransformerBlockResponse resp;
  const Clock::time_point t0 = Clock::now();
  const grpc::Status s = Block(server_, BlockRequest(1, S, input), &resp);
  const Clock::time_point t1 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a stalled stream resumes
  gen_ctx.TryCancel();
  watcher.join();
  reader->Finish();

  ASSERT_TRUE(s.ok()) << s.error_message();
  // The longest gap between messages that ends after the call started.
  double gap_s = 0;
  int64_t during = 0;
  for (size_t i = 1; i < reads.size(); ++i) {
    if (reads[i] < t0) continue;
    gap_s = std::max(gap_s, std::chrono::duration<double>(reads[i] - reads[i - 1]).count());
    if (reads[i] < t1) ++during;
  }
  std::printf(
      "TransformerBlock [1, %lld, 64]: %.2f s; stream's max gap between tokens meanwhile: %.3f s "
      "(%lld messages during the call)\n",
      static_cast<long long>(S), std::chrono::duration<double>(t1 - t0).count(), gap_s, static_cast<long long>(during));
  EXPECT_GT(during, 10);
  EXPECT_LT(gap_s, 1.0);

  // The result: rows are causal, so the first rows equal an in-process
  // unchunked run (RunLayers, whole-sequence attention) over that prefix.
  absl::StatusOr<HostTensor> out = TensorFromProto(resp.hidden(), "hidden", ValidationLimits{});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->shape, (std::vector<int64_t>{1, S, kD}));
  const std::vector<float> got = out->ToFloat();
  const int64_t P = 300;  // spans three chunks
  auto runner = MakeCpuModelRunner(ModelWeights::Random(*PresetConfig("tiny"), kSeed), 1);
  ASSERT_TRUE(runner.ok());
  std::vector<float> want(input.begin(), input.begin() + P * kD);
  std::vector<int64_t> pos(P);
  for (int64_t i = 0; i < P; ++i) pos[i] = i;
  ASSERT_TRUE((*runner)->RunLayers(0, 2, 1, P, pos.data(), want.data()).ok());
  for (int64_t i = 0; i < P * kD; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << "row " << i / kD;
  }
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
}

TEST_F(BlockSchedulingTest, OverTheTokenBoundIsInvalidArgument) {
  v1::TransformerBlockResponse resp;
  const grpc::Status s = Block(server_, BlockRequest(2, 4097, BlockInput(2, 4097)), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_block_tokens"), std::string::npos) << s.error_message();
}

TEST_F(BlockSchedulingTest, ShortDeadlineStopsTheWork) {
  const double before = RequestsTotal(server_->metrics_port(), "TransformerBlock", "DEADLINE_EXCEEDED");
  v1::TransformerBlockResponse resp;
  const Clock::time_point t0 = Clock::now();
  const grpc::Status s = Block(server_, BlockRequest(1, 8192, BlockInput(1, 8192)), &resp, /*timeout_s=*/0.3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  // The work stops at the next chunk boundary: a short Generate right after
  // is served at once, not after the rest of the block call.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = server_->stub()->Generate(&ctx, GenRequest(8));
  v1::GenerateResponse r;
  int tokens = 0;
  while (reader->Read(&r)) tokens += r.token_ids_size();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 8);
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("deadline-exceeded block call + an 8-token Generate: %.2f s\n", elapsed);
  EXPECT_LT(elapsed, 1.5);
  // The server itself answered DEADLINE_EXCEEDED.
  double after = before;
  for (int i = 0; i < 100 && after == before; ++i) {
    after = RequestsTotal(server_->metrics_port(), "TransformerBlock", "DEADLINE_EXCEEDED");
    if (after == before) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(after, before + 1);
}

TEST_F(BlockSchedulingTest, NanInputIsInvalidArgument) {
  std::vector<float> v = BlockInput(1, 4);
  v[1 * kD + 3] = std::nanf("");
  v1::TransformerBlockResponse resp;
  grpc::Status s = Block(server_, BlockRequest(1, 4, v), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("hidden[0, 1, 3]"), std::string::npos) << s.error_message();
  v[1 * kD + 3] = -INFINITY;
  s = Block(server_, BlockRequest(1, 4, v), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(RequestsTotal(server_->metrics_port(), "TransformerBlock", "INTERNAL"), 0);
}

TEST_F(BlockSchedulingTest, GenerateDeadlineIsRecordedAsDeadlineExceeded) {
  const double before = RequestsTotal(server_->metrics_port(), "Generate", "DEADLINE_EXCEEDED");
  const double cancelled_before = RequestsTotal(server_->metrics_port(), "Generate", "CANCELLED");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  auto reader = server_->stub()->Generate(&ctx, GenRequest(100000));
  v1::GenerateResponse r;
  int tokens = 0;
  while (reader->Read(&r)) tokens += r.token_ids_size();
  EXPECT_GT(tokens, 0);  // it expired mid-stream
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  double after = before;
  for (int i = 0; i < 100 && after == before; ++i) {
    after = RequestsTotal(server_->metrics_port(), "Generate", "DEADLINE_EXCEEDED");
    if (after == before) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(after, before + 1);
  EXPECT_EQ(RequestsTotal(server_->metrics_port(), "Generate", "CANCELLED"), cancelled_before);
}

}  // namespace
}  // namespace fusedserve
