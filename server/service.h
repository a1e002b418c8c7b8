// The fusedserve.v1.FusedServe gRPC service on the callback API. Validation
// runs on the gRPC thread (cheap); ops run on the scheduler's workers, which
// finish the RPC. Errors are absl::Status inside, mapped 1:1 to gRPC codes here.
#pragma once

#include <atomic>
#include <string>

#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "server/grpc_status.h"
#include "server/scheduler.h"
#include "server/validation.h"
#include "telemetry/metrics.h"

namespace fusedserve {

class Engine;       // engine/engine.h: the generation engine (TransformerBlock, Generate)
class TextSupport;  // server/text.h: the tokenizer (text prompts, Tokenize, Detokenize)

struct ServiceOptions {
  ValidationLimits limits;
};

// FusedOp is registered raw (bytes in, bytes out) and parsed here: on a body
// that does not parse, gRPC 1.51's typed callback handler answers
// UNIMPLEMENTED with an empty message and never calls the service.
// Generate and Tokenize are raw too, so that text that is not valid UTF-8
// gets INVALID_ARGUMENT naming the field (see model_rpc.h).
class FusedServeService final
    : public v1::FusedServe::WithRawCallbackMethod_FusedOp<v1::FusedServe::WithRawCallbackMethod_Generate<
          v1::FusedServe::WithRawCallbackMethod_Tokenize<v1::FusedServe::CallbackService>>> {
 public:
  FusedServeService(Backend* backend, OpScheduler* scheduler, Metrics* metrics, ServiceOptions options);

  // Until set, FusedOp answers UNAVAILABLE ("warming up").
  void set_ready(bool ready) { ready_.store(ready); }
  // Drain, step 1: new calls get UNAVAILABLE ("shutting down"), so clients
  // retry elsewhere while the calls already running finish.
  void StartDrain() {
    draining_.store(true);
    ready_.store(false);
  }
  // Drain, step 2 (the grace ran out): running FusedOps stop at their next
  // check and answer UNAVAILABLE.
  void AbortInFlight() { aborted_.store(true); }
  // Waits up to `timeout` for the calls in progress (FusedOp,
  // TransformerBlock, Generate streams) to finish; true when none is left.
  bool WaitIdle(absl::Duration timeout);
  void set_server_info(v1::GetServerInfoResponse info);
  // The model engine serving TransformerBlock and Generate; until set (or
  // when the server hosts no model) they answer UNIMPLEMENTED.
  void set_engine(Engine* engine) { engine_.store(engine); }
  // The tokenizer (owned by the caller, outliving the service); set before
  // serving. Until set, text requests get FAILED_PRECONDITION.
  void set_text(const TextSupport* text) { text_.store(text); }

  // A body that is not a FusedOpRequest: INVALID_ARGUMENT saying so.
  grpc::ServerUnaryReactor* FusedOp(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw_request,
                                    grpc::ByteBuffer* raw_response) override;
  grpc::ServerUnaryReactor* TransformerBlock(grpc::CallbackServerContext* ctx,
                                             const v1::TransformerBlockRequest* request,
                                             v1::TransformerBlockResponse* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* raw_request) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx, const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw_request,
                                     grpc::ByteBuffer* raw_response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;

 private:
  void Finish(grpc::ServerUnaryReactor* reactor, const std::string& rpc, const std::string& op, absl::Time start,
              const absl::Status& status);

  Backend* const backend_;
  OpScheduler* const scheduler_;
  Metrics* const metrics_;
  const ServiceOptions options_;
  // An RPC this service started and has not finished.
  void CallStarted();
  void CallFinished();
  // UNAVAILABLE while warming up or draining, else OK.
  absl::Status CheckAccepting() const;

  std::atomic<bool> ready_{false};
  std::atomic<bool> draining_{false};
  std::atomic<bool> aborted_{false};
  absl::Mutex calls_mu_;
  int64_t calls_in_flight_ ABSL_GUARDED_BY(calls_mu_) = 0;
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<const TextSupport*> text_{nullptr};
  absl::Mutex info_mu_;
  v1::GetServerInfoResponse info_ ABSL_GUARDED_BY(info_mu_);
};

}  // namespace fusedserve
