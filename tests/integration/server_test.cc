// End-to-end tests of the fusedserve binary on the CPU backend: real process,
// real gRPC, real HTTP scrape.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <regex>
#include <thread>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "server/validation.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::HttpGet;
using testing::ServerProcess;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = ServerProcess::Start().release(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  static grpc::Status Call(const v1::FusedOpRequest& req, v1::FusedOpResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return server_->stub()->FusedOp(&ctx, req, resp);
  }

  static ServerProcess* server_;
};
ServerProcess* ServerTest::server_ = nullptr;

TEST_F(ServerTest, HealthIsServing) { EXPECT_EQ(server_->Health(), grpc::health::v1::HealthCheckResponse::SERVING); }

// Health on the async API (the default) answers as gRPC's default health
// service does (which serves it with FusedOp on the callback API).
TEST(ServerHealth, AnswersAsGrpcsDefaultService) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, std::vector<std::string>{"--fused_op_api=callback"}}) {
    SCOPED_TRACE(flags.empty() ? "default" : flags[0]);
    std::unique_ptr<ServerProcess> server = ServerProcess::Start(flags);
    ASSERT_NE(server, nullptr);
    auto stub = grpc::health::v1::Health::NewStub(server->channel());
    auto check = [&](const std::string& service, grpc::health::v1::HealthCheckResponse* resp) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      grpc::health::v1::HealthCheckRequest req;
      req.set_service(service);
      return stub->Check(&ctx, req, resp);
    };
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(check("", &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    EXPECT_EQ(check("no.such.Service", &resp).error_code(), grpc::StatusCode::NOT_FOUND);
    for (const auto& [service, want] :
         {std::pair<std::string, grpc::health::v1::HealthCheckResponse::ServingStatus>{
              "", grpc::health::v1::HealthCheckResponse::SERVING},
          std::pair<std::string, grpc::health::v1::HealthCheckResponse::ServingStatus>{
              "no.such.Service", grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN}}) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      grpc::health::v1::HealthCheckRequest req;
      req.set_service(service);
      auto watch = stub->Watch(&ctx, req);
      grpc::health::v1::HealthCheckResponse first;
      ASSERT_TRUE(watch->Read(&first)) << service;
      EXPECT_EQ(first.status(), want) << service;
      ctx.TryCancel();
      watch->Finish();
    }
    // A watch sees the server's drain: NOT_SERVING once SIGTERM arrives.
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto watch = stub->Watch(&ctx, grpc::health::v1::HealthCheckRequest());
    ASSERT_TRUE(watch->Read(&resp));
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    server->Signal(SIGTERM);
    ASSERT_TRUE(watch->Read(&resp));
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    ctx.TryCancel();
    watch->Finish();
  }
}

TEST_F(ServerTest, ReflectionListsServices) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(server_->channel());
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1alpha::ServerReflectionRequest req;
  req.set_list_services("");
  ASSERT_TRUE(stream->Write(req));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& s : resp.list_services_response().service()) names.push_back(s.name());
  EXPECT_NE(std::find(names.begin(), names.end(), "fusedserve.v1.FusedServe"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "grpc.health.v1.Health"), names.end());
  EXPECT_TRUE(stream->Finish().ok());
}

// Small keys per op (TuningKey order, see kernels/op.h).
std::vector<int64_t> SmallKey(const std::string& op) {
  if (op == "rope") return {5, 4, 2, 16};
  if (op == "linear") return {3, 17, 24};
  if (op == "swiglu_mlp") return {3, 16, 40};
  if (op == "attention") return {9, 4, 2, 16};
  if (op == "attention_decode") return {3, 11, 4, 1, 16};
  return {3, 33};
}

// Every op, every float dtype: the server's answer equals the CPU reference
// run in-process on the same inputs (bit-exact: same code, same rounding).
TEST_F(ServerTest, EveryOpMatchesReference) {
  std::unique_ptr<Backend> reference = MakeCpuBackend();
  uint64_t seed = 1;
  for (const OpSpec& spec : AllOpSpecs()) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(spec.name + " " + DTypeName(dt));
      OpRequest r = MakeRandomRequest(spec.name, dt, SmallKey(spec.name), seed++);
      if (spec.name == "linear") {
        r.inputs["bias"] = HostTensor::FromFloat(dt, {17}, std::vector<float>(17, 0.25f));
        r.attrs["activation"] = std::string("silu");
      }
      v1::FusedOpResponse resp;
      grpc::Status st = Call(OpRequestToProto(r), &resp);
      ASSERT_TRUE(st.ok()) << st.error_message();
      EXPECT_EQ(resp.backend(), "cpu");
      absl::StatusOr<TensorMap> want = reference->Run(r);
      ASSERT_TRUE(want.ok());
      ASSERT_EQ(resp.outputs_size(), static_cast<int>(want->size()));
      for (const auto& [name, t] : *want) {
        ASSERT_TRUE(resp.outputs().count(name)) << name;
        const v1::Tensor& got = resp.outputs().at(name);
        EXPECT_EQ(got.dtype(), ToProtoDType(dt));
        EXPECT_EQ(std::vector<int64_t>(got.shape().begin(), got.shape().end()), t.shape);
        EXPECT_EQ(got.data(), t.data) << name;
      }
    }
  }
}

// rms_norm checked against a formula written here, so the wire path is
// tested independently of the reference code.
TEST_F(ServerTest, RmsNormValues) {
  const std::vector<float> x = {1, 2, 3, 4, -1, -2, -3, -4};
  const std::vector<float> w = {1, 0.5f, 2, 1};
  OpRequest r;
  r.op = "rms_norm";
  r.inputs["x"] = HostTensor::FromFloat(DType::kF32, {2, 4}, x);
  r.inputs["weight"] = HostTensor::FromFloat(DType::kF32, {4}, w);
  r.attrs["eps"] = 1e-6;
  v1::FusedOpResponse resp;
  ASSERT_TRUE(Call(OpRequestToProto(r), &resp).ok());
  absl::StatusOr<HostTensor> y = TensorFromProto(resp.outputs().at("y"), "y", {});
  ASSERT_TRUE(y.ok());
  const std::vector<float> got = y->ToFloat();
  const double rms = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(got[i], x[i] / rms * w[i % 4], 1e-5);
}

struct BadCase {
  std::string name;
  std::function<void(v1::FusedOpRequest&)> mutate;
  std::string expect_in_message;
};

TEST_F(ServerTest, MalformedRequestsAreRejectedAndServerStaysUp) {
  OpRequest good = MakeRandomRequest("rms_norm", DType::kF32, {3, 8}, 7);
  const std::vector<BadCase> cases = {
      {"unknown op", [](v1::FusedOpRequest& r) { r.set_op("rms_normz"); }, "unknown op 'rms_normz'"},
      {"missing input", [](v1::FusedOpRequest& r) { r.mutable_inputs()->erase("weight"); }, "missing input 'weight'"},
      {"extra input", [](v1::FusedOpRequest& r) { (*r.mutable_inputs())["bias"] = r.inputs().at("weight"); },
       "unexpected input 'bias'"},
      {"unspecified dtype", [](v1::FusedOpRequest& r) { (*r.mutable_inputs())["x"].set_dtype(v1::DTYPE_UNSPECIFIED); },
       "dtype"},
      {"invalid dtype enum",
       [](v1::FusedOpRequest& r) { (*r.mutable_inputs())["x"].set_dtype(static_cast<v1::DType>(77)); }, "dtype"},
      {"int dtype for float input",
       [](v1::FusedOpRequest& r) {
         v1::Tensor& x = (*r.mutable_inputs())["x"];
         x.set_dtype(v1::I32);
       },
       "expected F32, F16 or BF16"},
      {"mixed float dtypes",
       [](v1::FusedOpRequest& r) {
         v1::Tensor& w = (*r.mutable_inputs())["weight"];
         w.set_dtype(v1::BF16);
         w.set_data(std::string(16, '\0'));
       },
       "share one dtype"},
      {"data length", [](v1::FusedOpRequest& r) { (*r.mutable_inputs())["x"].mutable_data()->pop_back(); },
       "expected 96"},
      {"negative dim", [](v1::FusedOpRequest& r) { (*r.mutable_inputs())["x"].set_shape(0, -3); }, "must be >= 1"},
      {"zero dim", [](v1::FusedOpRequest& r) { (*r.mutable_inputs())["x"].set_shape(0, 0); }, "must be >= 1"},
      {"overflowing shape",
       [](v1::FusedOpRequest& r) {
         v1::Tensor& x = (*r.mutable_inputs())["x"];
         x.clear_shape();
         x.add_shape(int64_t{1} << 40);
         x.add_shape(int64_t{1} << 40);
       },
       "elements"},
      {"weight shape", [](v1::FusedOpRequest& r) { (*r.mutable_inputs())["weight"].set_shape(0, 4); },
       "input 'weight'"},
      {"eps zero", [](v1::FusedOpRequest& r) { (*r.mutable_attrs())["eps"].set_f(0); }, "'eps'"},
      {"eps wrong kind", [](v1::FusedOpRequest& r) { (*r.mutable_attrs())["eps"].set_s("small"); }, "'eps'"},
      {"unknown attr", [](v1::FusedOpRequest& r) { (*r.mutable_attrs())["epsilon"].set_f(1e-5); },
       "unknown attribute 'epsilon'"},
      {"attr without value", [](v1::FusedOpRequest& r) { (*r.mutable_attrs())["eps"].Clear(); }, "no value"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    v1::FusedOpRequest req = OpRequestToProto(good);
    c.mutate(req);
    v1::FusedOpResponse resp;
    grpc::Status st = Call(req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(c.expect_in_message), std::string::npos) << st.error_message();
  }
  // Op-specific rules.
  struct OpCase {
    std::string op;
    std::vector<int64_t> key;
    std::function<void(OpRequest&)> mutate;
    std::string expect;
  };
  const std::vector<OpCase> op_cases = {
      {"rope", {4, 4, 2, 16}, [](OpRequest& r) { r.attrs["theta"] = -1.0; }, "'theta'"},
      {"rope",
       {4, 4, 2, 16},
       [](OpRequest& r) {
         r.inputs["positions"] = HostTensor::FromInt64(DType::kI64, {4}, {0, 1, -2, 3});
       },
       "'positions' has value -2"},
      {"rope",
       {4, 4, 2, 16},
       [](OpRequest& r) {
         r.inputs["k"].shape = {4, 2, 8};
         r.inputs["k"].data.resize(4 * 2 * 8 * 4);
       },
       "input 'k'"},
      {"silu_and_mul",
       {2, 3},
       [](OpRequest& r) {
         r.inputs["x"] = HostTensor::FromFloat(DType::kF32, {2, 5}, std::vector<float>(10, 1));
       },
       "even"},
      {"linear", {2, 4, 8}, [](OpRequest& r) { r.attrs["activation"] = std::string("relu"); }, "'activation'"},
      {"linear",
       {2, 4, 8},
       [](OpRequest& r) { r.inputs["bias"] = HostTensor::FromFloat(DType::kF32, {5}, std::vector<float>(5, 1)); },
       "input 'bias'"},
      {"attention", {6, 4, 3, 8}, [](OpRequest&) {}, "multiple of kv heads"},
      {"attention",
       {6, 4, 2, 8},
       [](OpRequest& r) {
         r.inputs["seq_lens"] = HostTensor::FromInt64(DType::kI32, {2}, {2, 3});
       },
       "sums to 5"},
      {"attention_decode",
       {2, 5, 4, 2, 8},
       [](OpRequest& r) {
         r.inputs["lengths"] = HostTensor::FromInt64(DType::kI64, {2}, {5, 6});
       },
       "'lengths' has value 6"},
      {"gelu", {2, 3}, [](OpRequest& r) { r.attrs["approximate"] = std::string("fast"); }, "'approximate'"},
  };
  for (const OpCase& c : op_cases) {
    SCOPED_TRACE(c.op + " " + c.expect);
    OpRequest r = MakeRandomRequest(c.op, DType::kF32, c.key, 3);
    c.mutate(r);
    v1::FusedOpResponse resp;
    grpc::Status st = Call(OpRequestToProto(r), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find(c.expect), std::string::npos) << st.error_message();
  }
  // Still serving, and still correct.
  v1::FusedOpResponse resp;
  EXPECT_TRUE(Call(OpRequestToProto(good), &resp).ok());
  EXPECT_EQ(server_->Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ServerTest, MetricsCountRequests) {
  v1::FusedOpResponse resp;
  ASSERT_TRUE(Call(OpRequestToProto(MakeRandomRequest("softmax", DType::kF32, {2, 5}, 9)), &resp).ok());
  const std::string body = HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_NE(body.find("fusedserve_requests_total{code=\"OK\",op=\"softmax\",rpc=\"FusedOp\"}"), std::string::npos)
      << body.substr(0, 2000);
  EXPECT_NE(body.find("fusedserve_request_duration_seconds_bucket"), std::string::npos);
  EXPECT_NE(body.find("fusedserve_ready 1"), std::string::npos);
}

TEST_F(ServerTest, ServerInfoListsOps) {
  grpc::ClientContext ctx;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(server_->stub()->GetServerInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.device(), "cpu");
  EXPECT_EQ(info.ops_size(), static_cast<int>(AllOpSpecs().size()));
}

TEST_F(ServerTest, UnimplementedRpcsSaySo) {
  {
    grpc::ClientContext ctx;
    v1::TransformerBlockResponse resp;
    grpc::Status st = server_->stub()->TransformerBlock(&ctx, {}, &resp);
    if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      EXPECT_NE(st.error_message().find("TransformerBlock"), std::string::npos);
    }
  }
}

#ifdef FUSEDSERVE_HAVE_CUDA
// The binary links cuBLASLt; its metrics endpoint must still start (the
// scrape above proves it); here we make sure the link really is there.
TEST(CudaBuild, ServerLinksCublasLt) {
  const std::string cmd = std::string("readelf -d ") + std::getenv("FUSEDSERVE_BIN") + " | grep -q libcublasLt";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "fusedserve does not link libcublasLt";
}
#endif

// SIGTERM while requests are in flight: every admitted request completes,
// then the process exits 0. (A request that had not been admitted when the
// signal landed is refused with UNAVAILABLE and a retry hint; nothing else.)
TEST(ServerShutdown, SigtermDrainsInFlightRequests) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--worker_threads=2"});
  ASSERT_NE(server, nullptr);
  // Each takes a while on the CPU reference (M=512, K=N=1024: 1 GFLOP), so
  // with 2 workers some run and some wait in the queue when SIGTERM lands.
  constexpr int64_t kM = 512;
  const OpRequest r = MakeRandomRequest("linear", DType::kF32, {kM, 1024, 1024}, 5);
  const v1::FusedOpRequest req = OpRequestToProto(r);
  constexpr int kInFlight = 6;
  std::vector<std::future<grpc::Status>> calls;
  auto stub = server->stub();
  for (int i = 0; i < kInFlight; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      grpc::ClientContext ctx;
      v1::FusedOpResponse resp;
      grpc::Status st = stub->FusedOp(&ctx, req, &resp);
      if (st.ok() && resp.outputs().at("y").data().size() != kM * 1024 * 4) {
        return grpc::Status(grpc::StatusCode::DATA_LOSS, "short output");
      }
      return st;
    }));
  }
  // Signal once work is queued behind the two running requests (polled:
  // on a loaded machine the requests take a while to arrive).
  const std::regex depth_re("fusedserve_queue_depth\\{op=\"linear\"\\} ([0-9.]+)");
  double depth = 0;
  for (int i = 0; i < 2500 && depth < 2; ++i) {
    std::smatch m;
    const std::string body = HttpGet(server->metrics_port(), "/metrics");
    if (std::regex_search(body, m, depth_re)) depth = std::stod(m[1]);
    if (depth < 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GE(depth, 2) << "no request ever waited in the queue\n" << server->Log();
  server->Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    // New work is refused while draining.
    grpc::ClientContext ctx;
    v1::FusedOpResponse resp;
    grpc::Status st =
        server->stub()->FusedOp(&ctx, OpRequestToProto(MakeRandomRequest("softmax", DType::kF32, {1, 4}, 1)), &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  }
  // A request the drain turned away was refused at admission, with the
  // retry hint; an admitted one (running or queued) always completes.
  int completed = 0;
  for (auto& c : calls) {
    grpc::Status st = c.get();
    completed += st.ok();
    if (!st.ok()) {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
      EXPECT_NE(st.error_message().find("retry on another replica"), std::string::npos) << st.error_message();
    }
  }
  EXPECT_GE(completed, 2) << "the running requests complete";
  EXPECT_EQ(server->WaitExit(30), 0) << server->Log();
}

}  // namespace
}  // namespace fusedserve
