// Cheap but valid requests must not crash, stall or starve the server
// (docs/reliability.md), against the real binary on the CPU backend:
//   bounds     a few-MiB request asking for a huge output, intermediate or
//              amount of work gets RESOURCE_EXHAUSTED naming the flag;
//   deadline   long CPU work stops at the client's deadline or cancel and
//              frees its worker;
//   drain      SIGTERM with long requests running: they get UNAVAILABLE when
//              the grace ends, new calls get UNAVAILABLE, exit 0 on time;
//   queue      queued requests are bounded in bytes (--max_queued_bytes);
//   start-up   SIGTERM during start-up exits at once, never SERVING;
//   small      long client strings are cut in errors; `tune` without a GPU
//              fails clearly.
#include <signal.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/op.h"
#include "server/validation.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::HttpGet;
using testing::ServerProcess;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A tensor of `shape` whose bytes are all 0x3c (bf16 ~0.0117: finite, not zero).
v1::Tensor Bf16(std::vector<int64_t> shape) {
  v1::Tensor t;
  t.set_dtype(v1::BF16);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  t.set_data(std::string(static_cast<size_t>(n) * 2, '\x3c'));
  return t;
}

v1::Tensor I64(std::vector<int64_t> values) {
  v1::Tensor t;
  t.set_dtype(v1::I64);
  t.add_shape(static_cast<int64_t>(values.size()));
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 8));
  return t;
}

// One causal attention sequence of T tokens, 1 head of dim 8: 16 * T^2 FLOPs,
// 3 * 16 * T input bytes. T = 48K is ~3.7e10 FLOPs: under the CPU limit
// (5e10) and tens of seconds of work for the CPU reference.
v1::FusedOpRequest LongAttention(int64_t T = 48 * 1024) {
  v1::FusedOpRequest r;
  r.set_op("attention");
  (*r.mutable_inputs())["q"] = Bf16({T, 1, 8});
  (*r.mutable_inputs())["k"] = Bf16({T, 1, 8});
  (*r.mutable_inputs())["v"] = Bf16({T, 1, 8});
  (*r.mutable_inputs())["seq_lens"] = I64({T});
  return r;
}

v1::FusedOpRequest SmallRmsNorm() {
  v1::FusedOpRequest r;
  r.set_op("rms_norm");
  (*r.mutable_inputs())["x"] = Bf16({2, 64});
  (*r.mutable_inputs())["weight"] = Bf16({64});
  return r;
}

grpc::Status Call(ServerProcess& s, const v1::FusedOpRequest& req, double deadline_s = 60,
                  v1::FusedOpResponse* resp = nullptr) {
  v1::FusedOpResponse ignored;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(static_cast<int64_t>(deadline_s * 1e6)));
  return s.stub()->FusedOp(&ctx, req, resp != nullptr ? resp : &ignored);
}

void ExpectExhausted(const grpc::Status& s, const std::string& flag) {
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find(flag), std::string::npos) << s.error_message();
}

class BoundsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = ServerProcess::Start().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }
  // The server is still up and answers correctly.
  void ExpectAlive() {
    v1::FusedOpResponse resp;
    ASSERT_TRUE(Call(*server_, SmallRmsNorm(), 10, &resp).ok());
    EXPECT_EQ(resp.outputs().at("y").data().size(), 2u * 64 * 2);
  }
  static ServerProcess* server_;
};
ServerProcess* BoundsTest::server_ = nullptr;

// 4 MiB of inputs asking for a [2^20, 2^20] output (2 TiB): used to abort
// the process on std::bad_alloc.
TEST_F(BoundsTest, HugeLinearOutputIsRefused) {
  v1::FusedOpRequest r;
  r.set_op("linear");
  (*r.mutable_inputs())["x"] = Bf16({1 << 20, 1});
  (*r.mutable_inputs())["weight"] = Bf16({1 << 20, 1});
  ExpectExhausted(Call(*server_, r), "--max_message_bytes");
  ExpectAlive();
}

// A small output but a [M, 2I] intermediate of 2^37 elements.
TEST_F(BoundsTest, HugeSwigluIntermediateIsRefused) {
  v1::FusedOpRequest r;
  r.set_op("swiglu_mlp");
  (*r.mutable_inputs())["x"] = Bf16({1 << 16, 1});
  (*r.mutable_inputs())["gate_up"] = Bf16({1 << 21, 1});
  (*r.mutable_inputs())["down"] = Bf16({1, 1 << 20});
  ExpectExhausted(Call(*server_, r), "--max_op_bytes");
  ExpectAlive();
}

// 1.5 MiB of attention inputs asking for ~7e10 FLOPs (minutes on the CPU).
TEST_F(BoundsTest, TooMuchWorkIsRefused) {
  ExpectExhausted(Call(*server_, LongAttention(64 * 1024)), "--max_op_flops");
  ExpectAlive();
}

TEST_F(BoundsTest, LongClientStringsAreCutInErrors) {
  v1::FusedOpRequest r = SmallRmsNorm();
  r.set_op(std::string(8192, 'x'));
  grpc::Status s = Call(*server_, r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(s.error_message().size(), 400u) << s.error_message();
  EXPECT_NE(s.error_message().find("8192 bytes"), std::string::npos) << s.error_message();

  r = SmallRmsNorm();
  (*r.mutable_inputs())[std::string(8192, 'n')] = Bf16({1});
  s = Call(*server_, r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(s.error_message().size(), 400u) << s.error_message();
  ExpectAlive();
}

// Long CPU work stops at the deadline and at a cancel, and its worker is free
// again: with one worker, a small request right after answers at once.
TEST(DeadlineTest, LongWorkStopsAtDeadlineAndCancel) {
  auto server = ServerProcess::Start({"--worker_threads=1", "--batching=false"});
  ASSERT_NE(server, nullptr);
  Clock::time_point t0 = Clock::now();
  grpc::Status s = Call(*server, LongAttention(), 0.5);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  t0 = Clock::now();
  ASSERT_TRUE(Call(*server, SmallRmsNorm(), 10).ok());
  EXPECT_LT(SecondsSince(t0), 2.0) << "the worker is still busy with the expired request";

  grpc::ClientContext ctx;
  const v1::FusedOpRequest long_request = LongAttention();
  v1::FusedOpResponse resp;
  std::promise<grpc::Status> done;
  auto stub = server->stub();
  stub->async()->FusedOp(&ctx, &long_request, &resp, [&done](grpc::Status st) { done.set_value(st); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ctx.TryCancel();
  EXPECT_EQ(done.get_future().get().error_code(), grpc::StatusCode::CANCELLED);
  t0 = Clock::now();
  ASSERT_TRUE(Call(*server, SmallRmsNorm(), 10).ok());
  EXPECT_LT(SecondsSince(t0), 2.0) << "the worker is still busy with the cancelled request";
}

// Two long requests pin both workers; SIGTERM with a 2 s grace: they end
// with UNAVAILABLE, a call arriving meanwhile gets UNAVAILABLE, exit 0 well
// before Kubernetes' kill.
TEST(DrainTest, RunningCallsEndWithUnavailableWhenTheGraceEnds) {
  auto server = ServerProcess::Start({"--worker_threads=2", "--batching=false", "--shutdown_grace_seconds=2"});
  ASSERT_NE(server, nullptr);
  const v1::FusedOpRequest long_request = LongAttention();
  std::vector<std::future<grpc::Status>> running;
  for (int i = 0; i < 2; ++i) {
    running.push_back(std::async(std::launch::async, [&] { return Call(*server, long_request, 120); }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const Clock::time_point t0 = Clock::now();
  server->Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  grpc::Status late = Call(*server, SmallRmsNorm(), 5);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::UNAVAILABLE) << late.error_message();
  for (auto& f : running) {
    grpc::Status s = f.get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
  EXPECT_EQ(server->WaitExit(10), 0) << server->Log();
  EXPECT_LT(SecondsSince(t0), 5.0);
}

// With the worker busy, queued requests may hold at most --max_queued_bytes.
TEST(QueueTest, QueuedBytesAreBounded) {
  auto server = ServerProcess::Start(
      {"--worker_threads=1", "--batching=false", "--max_queued_bytes=2000000", "--shutdown_grace_seconds=1"});
  ASSERT_NE(server, nullptr);
  auto busy = std::async(std::launch::async, [&] { return Call(*server, LongAttention(), 3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  v1::FusedOpRequest big;  // 1.5 MB of inputs
  big.set_op("gelu");
  (*big.mutable_inputs())["x"] = Bf16({750, 1000});
  auto first = std::async(std::launch::async, [&] { return Call(*server, big, 10); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string metrics = HttpGet(server->metrics_port(), "/metrics");
  EXPECT_NE(metrics.find("fusedserve_queued_bytes 1500"), std::string::npos) << metrics;
  ExpectExhausted(Call(*server, big, 10), "--max_queued_bytes");
  EXPECT_EQ(busy.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(first.get().ok());
}

// A 1B-parameter random model takes seconds to build on the CPU: SIGTERM in
// the middle ends the process at once (128 + 15), and it never says SERVING.
TEST(StartupTest, SigtermDuringStartupExitsAtOnce) {
  auto server = ServerProcess::Spawn({"--model_preset=llama-3.2-1b", "--kv_cache_bytes=1048576"});
  ASSERT_NE(server, nullptr);
  const Clock::time_point t0 = Clock::now();
  while (server->Log().find("backend:") == std::string::npos && SecondsSince(t0) < 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  server->Signal(SIGTERM);
  const Clock::time_point t1 = Clock::now();
  EXPECT_EQ(server->WaitExit(10), 128 + SIGTERM) << server->Log();
  EXPECT_LT(SecondsSince(t1), 2.0);
  EXPECT_EQ(server->Log().find("SERVING"), std::string::npos) << server->Log();
}

TEST(StartupTest, TuneWithoutGpuFailsClearly) {
  auto tune = ServerProcess::Spawn({}, "tune");
  ASSERT_NE(tune, nullptr);
  const int code = tune->WaitExit(60);
  EXPECT_NE(code, 0) << tune->Log();
  EXPECT_NE(code, -1) << tune->Log();
  EXPECT_NE(tune->Log().find("needs a CUDA GPU"), std::string::npos) << tune->Log();
}

}  // namespace
}  // namespace fusedserve
