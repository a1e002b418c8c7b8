#include "server/service.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "server/model_rpc.h"

namespace fusedserve {

FusedServeService::FusedServeService(Backend* backend, OpScheduler* scheduler, Metrics* metrics, ServiceOptions options)
    : backend_(backend), scheduler_(scheduler), metrics_(metrics), options_(std::move(options)) {}

void FusedServeService::set_server_info(v1::GetServerInfoResponse info) {
  absl::MutexLock lock(&info_mu_);
  info_ = std::move(info);
}

void FusedServeService::CallStarted() {
  absl::MutexLock lock(&calls_mu_);
  ++calls_in_flight_;
}

void FusedServeService::CallFinished() {
  absl::MutexLock lock(&calls_mu_);
  --calls_in_flight_;
}

bool FusedServeService::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&calls_mu_);
  return calls_mu_.AwaitWithTimeout(absl::Condition(
                                        +[](int64_t* n) { return *n == 0; }, &calls_in_flight_),
                                    timeout);
}

absl::Status FusedServeService::CheckAccepting() const {
  if (draining_.load()) return absl::UnavailableError("server is shutting down; retry on another replica");
  if (!ready_.load()) return absl::UnavailableError("server is warming up; retry shortly");
  return absl::OkStatus();
}

void FusedServeService::Finish(grpc::ServerUnaryReactor* reactor, const std::string& rpc, const std::string& op,
                               absl::Time start, const absl::Status& status) {
  const grpc::Status g = ToGrpcStatus(status);
  metrics_->RecordRequest(rpc, op, GrpcCodeName(g.error_code()), absl::ToDoubleSeconds(absl::Now() - start));
  reactor->Finish(g);
  CallFinished();
}

namespace {

// One FusedOp call's messages; they live until the call finishes (the
// validated request may point into the parsed tensors).
struct FusedOpCall {
  v1::FusedOpRequest request;
  v1::FusedOpResponse response;
};

}  // namespace

grpc::ServerUnaryReactor* FusedServeService::FusedOp(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* raw_request,
                                                     grpc::ByteBuffer* raw_response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  CallStarted();
  auto call = std::make_shared<FusedOpCall>();
  // Deserialize consumes its buffer; the copy shares the slices (no byte copy).
  grpc::ByteBuffer body(*raw_request);
  if (!grpc::SerializationTraits<v1::FusedOpRequest>::Deserialize(&body, &call->request).ok()) {
    Finish(reactor, "FusedOp", "unknown", start,
           absl::InvalidArgumentError(absl::StrCat(
               "FusedOp: the request body (", raw_request->Length(),
               " bytes) is not a valid fusedserve.v1.FusedOpRequest; check that the client was generated from "
               "this server's fusedserve/v1/fusedserve.proto and sends a FusedOpRequest to this method")));
    return reactor;
  }
  const v1::FusedOpRequest* request = &call->request;
  // Label only known op names: arbitrary client strings must not create series.
  const std::string op = FindOpSpec(request->op()) != nullptr ? request->op() : "unknown";
  if (absl::Status s = CheckAccepting(); !s.ok()) {
    Finish(reactor, "FusedOp", op, start, s);
    return reactor;
  }
  // The parsed request is this call's own and is not read again: its tensor
  // bytes move into the OpRequest instead of being copied (a queued request
  // holds its inputs once, not twice).
  absl::StatusOr<OpRequest> validated = TakeValidatedFusedOp(call->request, options_.limits);
  if (!validated.ok()) {
    Finish(reactor, "FusedOp", op, start, validated.status());
    return reactor;
  }
  OpTask task;
  task.request = *std::move(validated);
  task.enqueued = start;
  task.deadline = absl::FromChrono(ctx->deadline());
  task.interrupted = [this, ctx]() -> absl::Status {
    if (aborted_.load()) {
      return absl::UnavailableError(
          "server is shutting down and its drain grace ran out before this request "
          "finished; retry on another replica");
    }
    if (ctx->IsCancelled()) return absl::CancelledError("request cancelled by the client");
    return absl::OkStatus();
  };
  task.done = [this, reactor, call, raw_response, op, start](absl::StatusOr<TensorMap> result) {
    absl::Status status = result.status();
    if (result.ok()) {
      v1::FusedOpResponse* response = &call->response;
      for (auto& [name, t] : *result) TensorToProto(std::move(t), &(*response->mutable_outputs())[name]);
      response->set_backend(backend_->name());
      bool own_buffer = false;
      const grpc::Status serialized =
          grpc::SerializationTraits<v1::FusedOpResponse>::Serialize(*response, raw_response, &own_buffer);
      if (!serialized.ok()) status = absl::InternalError("FusedOp: " + serialized.error_message());
    }
    Finish(reactor, "FusedOp", op, start, status);
  };
  if (absl::Status s = scheduler_->Submit(std::move(task)); !s.ok()) Finish(reactor, "FusedOp", op, start, s);
  return reactor;
}

grpc::ServerUnaryReactor* FusedServeService::TransformerBlock(grpc::CallbackServerContext* ctx,
                                                              const v1::TransformerBlockRequest* request,
                                                              v1::TransformerBlockResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  CallStarted();
  if (absl::Status s = CheckAccepting(); !s.ok()) {
    Finish(reactor, "TransformerBlock", "", start, s);
    return reactor;
  }
  StartTransformerBlock(
      engine_.load(), ctx, request, response, options_.limits,
      [this, reactor, start](const absl::Status& s) { Finish(reactor, "TransformerBlock", "", start, s); });
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* FusedServeService::Generate(grpc::CallbackServerContext* ctx,
                                                                        const grpc::ByteBuffer* raw_request) {
  CallStarted();
  return StartGenerate(engine_.load(), metrics_, text_.load(), CheckAccepting(), ctx, raw_request,
                       [this] { CallFinished(); });
}

grpc::ServerUnaryReactor* FusedServeService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                           const v1::GetServerInfoRequest*,
                                                           v1::GetServerInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  {
    absl::MutexLock lock(&info_mu_);
    *response = info_;
  }
  CallStarted();  // balanced by Finish
  Finish(reactor, "GetServerInfo", "", absl::Now(), absl::OkStatus());
  return reactor;
}

// Tokenize and Detokenize run on the gRPC thread: encoding is far cheaper
// than a queue hop, and needs no warm device.
grpc::ServerUnaryReactor* FusedServeService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw_request,
                                                      grpc::ByteBuffer* raw_response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  CallStarted();
  Finish(reactor, "Tokenize", "", start, fusedserve::Tokenize(text_.load(), *raw_request, raw_response));
  return reactor;
}

grpc::ServerUnaryReactor* FusedServeService::Detokenize(grpc::CallbackServerContext* ctx,
                                                        const v1::DetokenizeRequest* request,
                                                        v1::DetokenizeResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  CallStarted();
  Engine* engine = engine_.load();
  const TextSupport* text = text_.load();
  const int64_t vocab = engine != nullptr                                 ? engine->config().vocab
                        : text != nullptr && text->tokenizer() != nullptr ? text->tokenizer()->vocab_size()
                                                                          : 0;
  Finish(reactor, "Detokenize", "", start, fusedserve::Detokenize(text, vocab, *request, response));
  return reactor;
}

}  // namespace fusedserve
