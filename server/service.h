// The fusedserve.v1.FusedServe gRPC service. A FusedOp is parsed and
// validated on the gRPC thread that received it and handed to the scheduler,
// which runs small ops right there when idle (no hand-off to a worker and
// back) and otherwise queues them for a launch, merged with others under
// load; whichever thread ran it encodes and sends the response. The server
// serves FusedOp on completion queues with dedicated polling threads
// (--fused_op_api=async, the default: fused_op_service() and StartAsync, with
// every other RPC on the same queues: server/async_calls.h), on gRPC's
// callback API (this class's FusedOp) or on its sync API; with those two the
// other RPCs use the callback API. bench/run_grpc_floor.sh measures the
// three. Errors are absl::Status inside, mapped 1:1 to gRPC codes here.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "server/async_calls.h"
#include "server/fused_op_wire.h"
#include "server/grpc_status.h"
#include "server/scheduler.h"
#include "server/validation.h"
#include "telemetry/metrics.h"

namespace fusedserve {

class Engine;       // engine/engine.h: the generation engine (TransformerBlock, Generate)
class TextSupport;  // server/text.h: the tokenizer (text prompts, Tokenize, Detokenize)

struct ServiceOptions {
  ValidationLimits limits;
  // The gRPC API serving FusedOp. kSync and kAsync: this service leaves
  // FusedOp to fused_op_service(), which the server registers beside it.
  enum class FusedOpApi { kCallback, kSync, kAsync };
  FusedOpApi fused_op_api = FusedOpApi::kCallback;  // the server's flag defaults to kAsync
  int async_calls_per_cq = 64;                      // kAsync: FusedOp calls kept requested per queue and thread
  // kAsync: a result from a scheduler worker is answered on the call's own
  // polling thread (handed over through the queue) rather than on the worker.
  bool answer_on_poller = true;
  // kAsync: how long a polling thread keeps polling its queue without
  // blocking after each event (PollCompletionQueue).
  absl::Duration poll_spin = absl::ZeroDuration();
  // kAsync: at most this many polling threads spin at once (SpinSlots); 0:
  // no bound.
  int poll_spinners = 0;
  // FusedOp bodies decoded and encoded by server/fused_op_wire.h (protobuf
  // only for what it leaves); false: protobuf messages throughout.
  bool wire_codec = true;
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
  ~FusedServeService() override;
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
  // With fused_op_api kSync: FusedOp's own service, to register beside this
  // one (the server then needs a generic service too, as this one marks
  // FusedOp generic). With kAsync: the async service of every method, to
  // register instead of this one. nullptr otherwise.
  grpc::Service* fused_op_service() { return fused_op_service_.get(); }
  // kAsync, once the server has started: `threads` polling threads over the
  // queues the server builder made (round robin, at least one per queue),
  // each queue keeping async_calls_per_cq FusedOp calls per thread requested
  // and one call of every other method, and serving `health` (registered
  // with the server; may be null) on them. StopAsync, after the server's
  // Shutdown: shuts the queues down and joins the threads.
  void StartAsync(const std::vector<grpc::ServerCompletionQueue*>& cqs, int threads, AsyncHealth* health);
  void StopAsync();
  // The sync-API FusedOp, on the thread that received it: returns once the
  // response is in `raw_response` or the call failed.
  grpc::Status HandleFusedOp(grpc::ServerContext* ctx, const grpc::ByteBuffer& raw_request,
                             grpc::ByteBuffer* raw_response);
  Metrics* metrics() const { return metrics_; }
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

  // FusedOp's steps, shared by both APIs. Decode parses and validates (the
  // receive and decode stages) and sets *op to the metrics label; Encode
  // writes the response (the encode stage); FinishFusedOp counts the call.
  absl::StatusOr<OpRequest> DecodeFusedOp(const grpc::ByteBuffer& raw_request, absl::Time start, std::string* op);
  // With `early` (the call's, reused), the response is encoded while the
  // GPU runs where the backend allows (EarlyFusedOpResponse) and
  // EncodeFusedOp then only copies the outputs' bytes in.
  OpTask MakeFusedOpTask(OpRequest request, grpc::ServerContextBase* ctx, grpc::ByteBuffer* raw_response = nullptr,
                         EarlyFusedOpResponse* early = nullptr);
  absl::Status EncodeFusedOp(TensorMap outputs, grpc::ByteBuffer* raw_response, EarlyFusedOpResponse* early = nullptr);
  grpc::Status FinishFusedOp(const std::string& op, absl::Time start, const absl::Status& status);
  // The callback API's FusedOp calls: reactors recycled through a pool.
  class FusedOpCall;
  class AsyncFusedOpSlot;  // the async API's call slots
  void PollAsync(grpc::ServerCompletionQueue* cq);
  void MakeAsyncHandlers();
  // The vocabulary Detokenize accepts: the model's, else the tokenizer's.
  int64_t Vocab() const;
  FusedOpCall* NewFusedOpCall();
  void RecycleFusedOpCall(FusedOpCall* call);

  Backend* const backend_;
  const std::string backend_name_;  // backend_->name(), the responses' `backend`
  OpScheduler* const scheduler_;
  Metrics* const metrics_;
  const ServiceOptions options_;
  std::unique_ptr<grpc::Service> fused_op_service_;
  // kAsync: the queues, their threads, FusedOp's call slots and the other
  // methods' handlers; calls re-request their method only while the gate is
  // open (StopAsync closes it before it shuts the queues down).
  std::vector<grpc::ServerCompletionQueue*> async_cqs_;
  std::vector<std::thread> async_threads_;
  std::unique_ptr<SpinSlots> spin_slots_;  // kAsync with poll_spinners > 0
  std::vector<std::unique_ptr<AsyncFusedOpSlot>> async_slots_;
  AsyncUnaryCall::Handler unary_handlers_[AsyncFusedServe::kDetokenize + 1];
  AsyncGenerateCall::Handler generate_handler_;
  CqGate gate_;
  absl::Mutex pool_mu_;
  std::vector<void*> pool_ ABSL_GUARDED_BY(pool_mu_);  // FusedOpCall-sized blocks
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
