// Request bodies that are not valid protobuf for the method
// (docs/reliability.md): what the client sees, and that the server stays up. The calls go
// through grpc::GenericStub with raw bytes, as a broken or foreign client
// would send them.
#include <chrono>
#include <cstdio>
#include <future>
#include <string>

#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/validation.h"
#include "tests/integration/server_process.h"

namespace fusedserve {
namespace {

using testing::ServerProcess;

grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

grpc::Status CallRmsNorm(const ServerProcess& server) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::FusedOpResponse resp;
  return server.stub()->FusedOp(&ctx, OpRequestToProto(MakeRandomRequest("rms_norm", DType::kF32, {2, 8}, 1)), &resp);
}

class MalformedBodyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = ServerProcess::Start().release(); }
  static void TearDownTestSuite() { delete server_; }
  void SetUp() override { ASSERT_NE(server_, nullptr); }
  static ServerProcess* server_;
};
ServerProcess* MalformedBodyTest::server_ = nullptr;

// Field 1 (op, a string) announcing 100 bytes where 3 follow: truncated.
const std::string kTruncated = std::string("\x0a\x64", 2) + "abc";
// Bytes that are no protobuf at all (field number 0, then a varint of 10 bytes of 0xff).
const std::string kGarbage = std::string("\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11);

TEST_F(MalformedBodyTest, FusedOpSaysTheBodyIsNotAFusedOpRequest) {
  for (const std::string& bytes : {kTruncated, kGarbage}) {
    grpc::Status s = RawCall(server_->channel(), "/fusedserve.v1.FusedServe/FusedOp", bytes);
    std::printf("FusedOp with %zu bad bytes: code %d, message '%s'\n", bytes.size(), s.error_code(),
                s.error_message().c_str());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_NE(s.error_message().find("not a valid fusedserve.v1.FusedOpRequest"), std::string::npos)
        << s.error_message();
  }
  EXPECT_TRUE(CallRmsNorm(*server_).ok());
  // Counted like any other rejected request (a call's metric updates land
  // just after its answer is written: scrape until they are there).
  const std::string counted = "fusedserve_requests_total{code=\"INVALID_ARGUMENT\",op=\"unknown\",rpc=\"FusedOp\"} 2";
  EXPECT_NE(testing::ScrapeUntil(server_->metrics_port(),
                                 [&](const std::string& m) { return m.find(counted) != std::string::npos; })
                .find(counted),
            std::string::npos);
}

// Generate and Tokenize parse their bodies themselves too (so that text that
// is not valid UTF-8 is INVALID_ARGUMENT naming the field): a body that is
// not their request says so.
TEST_F(MalformedBodyTest, TextMethodsSayTheBodyIsNotTheirRequest) {
  for (const auto& [method, type] :
       {std::pair<const char*, const char*>{"/fusedserve.v1.FusedServe/Generate", "GenerateRequest"},
        std::pair<const char*, const char*>{"/fusedserve.v1.FusedServe/Tokenize", "TokenizeRequest"}}) {
    grpc::Status s = RawCall(server_->channel(), method, kGarbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(std::string("not a valid fusedserve.v1.") + type), std::string::npos)
        << s.error_message();
  }
  EXPECT_EQ(server_->Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// The other methods parse their bodies themselves on the async API (the
// default: every method on completion queues): a body that is not their
// request says so, like the text methods.
TEST_F(MalformedBodyTest, OtherMethodsSayTheBodyIsNotTheirRequest) {
  for (const auto& [method, type] :
       {std::pair<const char*, const char*>{"/fusedserve.v1.FusedServe/TransformerBlock", "TransformerBlockRequest"},
        std::pair<const char*, const char*>{"/fusedserve.v1.FusedServe/GetServerInfo", "GetServerInfoRequest"},
        std::pair<const char*, const char*>{"/fusedserve.v1.FusedServe/Detokenize", "DetokenizeRequest"}}) {
    grpc::Status s = RawCall(server_->channel(), method, kGarbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(std::string("not a valid fusedserve.v1.") + type), std::string::npos)
        << s.error_message();
  }
  EXPECT_TRUE(CallRmsNorm(*server_).ok());
  EXPECT_EQ(server_->Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// With FusedOp on the callback API the other methods keep gRPC 1.51's typed
// callback handlers: a body that does not parse gets UNIMPLEMENTED with an
// empty message from gRPC itself (the service never sees the call). Pinned
// so that a change shows up here.
TEST(MalformedBodyCallbackApi, OtherMethodsAnswerUnimplementedWithoutMessage) {
  std::unique_ptr<ServerProcess> server = ServerProcess::Start({"--fused_op_api=callback"});
  ASSERT_NE(server, nullptr);
  for (const char* method : {"/fusedserve.v1.FusedServe/TransformerBlock", "/fusedserve.v1.FusedServe/GetServerInfo",
                             "/fusedserve.v1.FusedServe/Detokenize"}) {
    grpc::Status s = RawCall(server->channel(), method, kGarbage);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << method << ": " << s.error_message();
    EXPECT_EQ(s.error_message(), "") << method;
  }
  EXPECT_TRUE(CallRmsNorm(*server).ok());
  EXPECT_EQ(server->Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace fusedserve
