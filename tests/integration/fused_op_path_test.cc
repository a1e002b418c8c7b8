// The FusedOp hot path (issue 18): small ops run on the gRPC thread that
// received them (inline, counted by fusedserve_inline_launches_total), every
// request's stages land in fusedserve_fused_op_stage_seconds, concurrent
// requests still merge (the batcher), and the three gRPC APIs
// (--fused_op_api: async by default, callback, sync) answer the same. Generate streams observe
// fusedserve_generate_token_send_seconds, and the engine its step times
// (fusedserve_engine_step_seconds).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "server/validation.h"
#include "tests/gpu/rel_error.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::ServerProcess;

const char* const kStages[] = {"receive", "decode", "queue", "h2d", "kernel", "d2h", "encode", "send"};

// The value of the sample line `series` (name{labels} exactly as exposed), or -1.
double Sample(const std::string& metrics, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(metrics, '\n')) {
    if (line.size() > series.size() + 1 && line.substr(0, series.size()) == series && line[series.size()] == ' ') {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

double StageCount(const std::string& metrics, const std::string& stage) {
  return Sample(metrics, "fusedserve_fused_op_stage_seconds_count{stage=\"" + stage + "\"}");
}

// Scrapes until `pred` holds (a call's updates, the send stage last, land
// after the client already has its answer).
std::string ScrapeUntil(const ServerProcess& server, const std::function<bool(const std::string&)>& pred) {
  return testing::ScrapeUntil(server.metrics_port(), pred);
}

// An rms_norm request; every one shares one weight (so that concurrent calls
// may merge).
OpRequest RmsNormRequest(uint64_t seed, int64_t rows, int64_t hidden) {
  OpRequest r = MakeRandomRequest("rms_norm", DType::kF32, {rows, hidden}, seed);
  r.inputs["weight"] = MakeRandomRequest("rms_norm", DType::kF32, {1, hidden}, 1).inputs["weight"];
  return r;
}

// The answer to `r` against the CPU reference.
void ExpectMatchesCpu(const OpRequest& r, const v1::FusedOpResponse& resp) {
  absl::StatusOr<TensorMap> want = MakeCpuBackend()->Run(r);
  ASSERT_TRUE(want.ok());
  absl::StatusOr<HostTensor> got = TensorFromProto(resp.outputs().at("y"), "y", {});
  ASSERT_TRUE(got.ok());
  const std::vector<float> g = got->ToFloat(), w = want->at("y").ToFloat();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-5 * (1 + std::abs(w[i]))) << i;
}

// One FusedOp call with a 30 s deadline.
grpc::Status CallFusedOp(const ServerProcess& server, const v1::FusedOpRequest& req, v1::FusedOpResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return server.stub()->FusedOp(&ctx, req, resp);
}

// One rms_norm call checked against the CPU reference.
void CallAndCheck(const ServerProcess& server, uint64_t seed, int64_t rows = 2, int64_t hidden = 64) {
  const OpRequest r = RmsNormRequest(seed, rows, hidden);
  v1::FusedOpResponse resp;
  const grpc::Status st = CallFusedOp(server, OpRequestToProto(r), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ExpectMatchesCpu(r, resp);
}

// Lets `n` threads go on together, round after round.
class RoundBarrier {
 public:
  explicit RoundBarrier(int n) : n_(n) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const int round = round_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++round_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return round_ != round; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int waiting_ = 0;
  int round_ = 0;
};

void SequentialCallsRunInlineAndStampEveryStage(const std::vector<std::string>& flags) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(flags);
  ASSERT_NE(server, nullptr);
  constexpr int kCalls = 20;
  for (int i = 0; i < kCalls; ++i) CallAndCheck(*server, 100 + i);
  // Every update made (those of a call land after its answer is written).
  const std::string requests = "fusedserve_requests_total{code=\"OK\",op=\"rms_norm\",rpc=\"FusedOp\"}";
  const std::string m = ScrapeUntil(*server, [&](const std::string& s) {
    for (const char* stage : kStages) {
      if (StageCount(s, stage) < kCalls) return false;
    }
    return Sample(s, requests) >= kCalls;
  });
  // One at a time: each found the scheduler idle and ran on its gRPC thread.
  EXPECT_EQ(Sample(m, "fusedserve_inline_launches_total"), kCalls) << m;
  for (const char* stage : kStages) EXPECT_EQ(StageCount(m, stage), kCalls) << stage;
  // The CPU backend does not split its work: it is all "kernel".
  EXPECT_EQ(Sample(m, "fusedserve_fused_op_stage_seconds_sum{stage=\"h2d\"}"), 0);
  EXPECT_GT(Sample(m, "fusedserve_fused_op_stage_seconds_sum{stage=\"kernel\"}"), 0);
  EXPECT_EQ(Sample(m, requests), kCalls);
}

TEST(FusedOpPath, SequentialCallsRunInlineAndStampEveryStage) { SequentialCallsRunInlineAndStampEveryStage({}); }

// Polling threads that block at once after each event (the default keeps
// polling for a while first).
TEST(FusedOpPath, BlockingPollersRunInlineAndStampEveryStage) {
  SequentialCallsRunInlineAndStampEveryStage({"--grpc_poll_spin_us=0"});
}

TEST(FusedOpPath, SyncApiRunsInlineAndStampsEveryStage) {
  SequentialCallsRunInlineAndStampEveryStage({"--fused_op_api=sync"});
}
TEST(FusedOpPath, CallbackApiRunsInlineAndStampsEveryStage) {
  SequentialCallsRunInlineAndStampEveryStage({"--fused_op_api=callback"});
}

TEST(FusedOpPath, InlineOffSendsEveryRequestToTheWorkers) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--inline_max_bytes=0"});
  ASSERT_NE(server, nullptr);
  for (int i = 0; i < 5; ++i) CallAndCheck(*server, 200 + i);
  const std::string m = ScrapeUntil(
      *server, [](const std::string& s) { return StageCount(s, "send") >= 5 && StageCount(s, "queue") >= 5; });
  EXPECT_EQ(Sample(m, "fusedserve_inline_launches_total"), 0);
  EXPECT_EQ(StageCount(m, "queue"), 5);
}

TEST(FusedOpPath, BadFusedOpApiFlagIsRejected) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Spawn({"--fused_op_api=bogus"});
  EXPECT_EQ(server->WaitExit(30), 1);
  EXPECT_NE(server->Log().find("--fused_op_api must be callback, sync or async"), std::string::npos) << server->Log();
}

// Both of gRPC's engines the flag offers serve (the default is poll), and
// the log names the one in use; anything else is refused at start.
TEST(FusedOpPath, EachPollEngineServes) {
  for (const char* engine : {"poll", "epoll1"}) {
    SCOPED_TRACE(engine);
    std::unique_ptr<ServerProcess> server = ServerProcess::Start({std::string("--grpc_poll_strategy=") + engine});
    ASSERT_NE(server, nullptr);
    for (int i = 0; i < 5; ++i) CallAndCheck(*server, 300 + i, 1 + i % 3);
    // (GRPC_POLL_STRATEGY in the environment would win over the flag.)
    if (std::getenv("GRPC_POLL_STRATEGY") == nullptr) {
      EXPECT_NE(server->Log().find(std::string("gRPC poll engine ") + engine), std::string::npos) << server->Log();
    }
  }
}

TEST(FusedOpPath, BadCudaLanesFlagIsRejected) {
  for (const char* bad : {"0", "65"}) {
    std::unique_ptr<ServerProcess> server = ServerProcess::Spawn({std::string("--cuda_small_op_lanes=") + bad});
    EXPECT_EQ(server->WaitExit(30), 2);
    EXPECT_NE(server->Log().find("expected 1..64"), std::string::npos) << server->Log();
  }
}

TEST(FusedOpPath, BadPollStrategyFlagIsRejected) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Spawn({"--grpc_poll_strategy=bogus"});
  EXPECT_EQ(server->WaitExit(30), 2);
  EXPECT_NE(server->Log().find("--grpc_poll_strategy=bogus: expected poll, epoll1 or empty"), std::string::npos)
      << server->Log();
}

// Under concurrency requests still merge: with a batch delay long enough for
// 8 concurrent callers to meet, fewer launches than requests happen, and
// every caller gets its own rows. One CUDA lane, so that against the CUDA
// backend (FUSEDSERVE_TEST_SERVER_FLAGS=--device=cuda) the callers queue too
// instead of each running inline on a free lane.
void ConcurrentCallsStillBatch(const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--batch_max_delay_us=20000", "--batch_parallel_launches=1", "--worker_threads=1",
                                    "--cuda_small_op_lanes=1"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  std::unique_ptr<ServerProcess> server = ServerProcess::Start(flags);
  ASSERT_NE(server, nullptr);
  // Each round the callers start together, their requests built before and
  // their answers checked after, so that they meet however fast the backend
  // is: on a GPU the op takes microseconds, and callers that built and
  // checked between calls seldom overlapped (no merge at all in one H200 run).
  constexpr int kThreads = 8, kEach = 10;
  std::vector<OpRequest> calls;
  // Rows of 32768: long enough on the CPU backend for callers to meet.
  for (int i = 0; i < kThreads * kEach; ++i) calls.push_back(RmsNormRequest(1000 + i, 1 + (i / kEach) % 3, 32768));
  std::vector<v1::FusedOpResponse> answers(calls.size());
  std::vector<grpc::Status> statuses(calls.size());
  RoundBarrier barrier(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<v1::FusedOpRequest> protos;
      for (int i = 0; i < kEach; ++i) protos.push_back(OpRequestToProto(calls[t * kEach + i]));
      for (int i = 0; i < kEach; ++i) {
        barrier.Wait();
        statuses[t * kEach + i] = CallFusedOp(*server, protos[i], &answers[t * kEach + i]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < calls.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(statuses[i].ok()) << statuses[i].error_message();
    ExpectMatchesCpu(calls[i], answers[i]);
  }
  const std::string m = ScrapeUntil(*server, [](const std::string& s) {
    return StageCount(s, "send") >= kThreads * kEach && StageCount(s, "decode") >= kThreads * kEach &&
           Sample(s, "fusedserve_batch_size_sum{op=\"rms_norm\"}") >= kThreads * kEach;
  });
  const double requests = Sample(m, "fusedserve_batch_size_sum{op=\"rms_norm\"}");
  const double launches = Sample(m, "fusedserve_batch_size_count{op=\"rms_norm\"}");
  EXPECT_EQ(requests, kThreads * kEach) << m;
  EXPECT_LT(launches, requests) << "no request was merged";
  EXPECT_EQ(StageCount(m, "decode"), kThreads * kEach);
}

TEST(FusedOpPath, ConcurrentCallsStillBatch) { ConcurrentCallsStillBatch({}); }
TEST(FusedOpPath, ConcurrentCallsStillBatchOnTheSyncApi) { ConcurrentCallsStillBatch({"--fused_op_api=sync"}); }
TEST(FusedOpPath, ConcurrentCallsStillBatchOnTheCallbackApi) { ConcurrentCallsStillBatch({"--fused_op_api=callback"}); }
// Four polling threads of which one may spin at a time: the others block
// after each event and still serve their calls.
TEST(FusedOpPath, ConcurrentCallsStillBatchWithOneSpinner) {
  ConcurrentCallsStillBatch({"--grpc_pollers=4", "--grpc_poll_spinners=1"});
}
// Four polling threads sharing one completion queue (--grpc_cqs): a call's
// events may then come on different threads.
TEST(FusedOpPath, ConcurrentCallsStillBatchOnASharedQueue) {
  ConcurrentCallsStillBatch({"--grpc_cqs=1", "--grpc_pollers=4"});
}

// Many callers at once, each on its own connection, with a mix of small
// row-wise ops (inline; on the CUDA backend on its small-op lanes, side by
// side), row-wise ops too large to run inline, and GEMMs (one at a time):
// every answer is the caller's own, within the dtype's tolerance of the CPU
// reference. (On a GPU host: FUSEDSERVE_TEST_SERVER_FLAGS=--device=cuda.)
TEST(FusedOpPath, ConcurrentMixedOpsGetTheirOwnAnswers) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--batch_max_delay_us=500"});
  ASSERT_NE(server, nullptr);
  struct Case {
    const char* op;
    DType dtype;
    std::vector<int64_t> key;
  };
  const std::vector<Case> cases = {{"rms_norm", DType::kBF16, {1, 4096}},  {"rms_norm", DType::kF32, {3, 769}},
                                   {"softmax", DType::kBF16, {2, 4000}},   {"add_rms_norm", DType::kBF16, {2, 1024}},
                                   {"rope", DType::kBF16, {5, 8, 2, 64}},  {"silu_and_mul", DType::kF32, {4, 1376}},
                                   {"rms_norm", DType::kBF16, {40, 4096}},  // 320 KiB: above --inline_max_bytes
                                   {"linear", DType::kBF16, {9, 256, 128}}};
  constexpr int kThreads = 12, kEach = 16;
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<v1::FusedServe::Stub> stub =
          v1::FusedServe::NewStub(server->NewChannel(grpc::InsecureChannelCredentials()));
      std::unique_ptr<Backend> cpu = MakeCpuBackend();
      for (int i = 0; i < kEach; ++i) {
        const Case& c = cases[static_cast<size_t>(t * 3 + i) % cases.size()];
        const OpRequest r = MakeRandomRequest(c.op, c.dtype, c.key, static_cast<uint64_t>(5000 + 100 * t + i));
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        v1::FusedOpResponse resp;
        const grpc::Status st = stub->FusedOp(&ctx, OpRequestToProto(r), &resp);
        absl::StatusOr<TensorMap> want = cpu->Run(r);
        if (!st.ok() || !want.ok()) {
          ADD_FAILURE() << c.op << ": " << st.error_message();
          ++failed;
          continue;
        }
        const double tol = c.dtype == DType::kF32 ? 1e-4 : 2e-2;
        for (const auto& [name, w] : *want) {
          const auto it = resp.outputs().find(name);
          absl::StatusOr<HostTensor> got =
              it == resp.outputs().end() ? absl::NotFoundError(name) : TensorFromProto(it->second, name, {});
          if (!got.ok() || got->shape != w.shape || RelErrorNorm(got->ToFloat(), w.ToFloat()) > tol) {
            ADD_FAILURE() << c.op << " output " << name << " of call " << t << "/" << i;
            ++failed;
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0) << server->Log();
}

// The async API's queues (the default) stop cleanly on SIGTERM (drain, then exit 0).
TEST(FusedOpPath, AsyncApiDrainsOnSigterm) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--grpc_pollers=2"});
  ASSERT_NE(server, nullptr);
  CallAndCheck(*server, 7);
  server->Signal(SIGTERM);
  EXPECT_EQ(server->WaitExit(30), 0) << server->Log();
}

TEST(FusedOpPath, GenerateObservesTokenSendTime) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start();
  ASSERT_NE(server, nullptr);
  v1::GenerateRequest req;
  for (int t : {1, 2, 3, 4}) req.add_prompt_token_ids(t);
  req.set_max_new_tokens(8);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = server->stub()->Generate(&ctx, req);
  v1::GenerateResponse resp;
  int tokens = 0, messages = 0;
  while (reader->Read(&resp)) {
    tokens += resp.token_ids_size();
    messages += resp.token_ids_size() > 0 ? 1 : 0;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(tokens, 8);
  const std::string m = ScrapeUntil(*server, [&](const std::string& s) {
    return Sample(s, "fusedserve_generate_token_send_seconds_count") >= messages;
  });
  EXPECT_EQ(Sample(m, "fusedserve_generate_token_send_seconds_count"), messages) << m;
  EXPECT_GT(Sample(m, "fusedserve_generate_token_send_seconds_sum"), 0);
  // The engine's steps: the prompt's forward pass and seven decodes, each
  // decode after a between-forwards span.
  EXPECT_GE(Sample(m, "fusedserve_engine_step_seconds_count{part=\"forward\"}"), 8) << m;
  EXPECT_GE(Sample(m, "fusedserve_engine_step_seconds_count{part=\"between\"}"), 7) << m;
  EXPECT_GT(Sample(m, "fusedserve_engine_step_seconds_sum{part=\"between\"}"), 0) << m;
}

}  // namespace
}  // namespace fusedserve
