#include "server/service.h"

#include <pthread.h>

#include <chrono>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "google/protobuf/arena.h"
#include "grpcpp/alarm.h"
#include "grpcpp/support/method_handler.h"
#include "kernels/clock.h"
#include "server/async_calls.h"
#include "server/fused_op_wire.h"
#include "server/model_rpc.h"

namespace fusedserve {

namespace {
std::unique_ptr<grpc::Service> MakeFusedOpService(FusedServeService* service);
}  // namespace

FusedServeService::FusedServeService(Backend* backend, OpScheduler* scheduler, Metrics* metrics, ServiceOptions options)
    : backend_(backend),
      backend_name_(backend->name()),
      scheduler_(scheduler),
      metrics_(metrics),
      options_(std::move(options)) {
  if (options_.fused_op_api != ServiceOptions::FusedOpApi::kCallback) {
    // Registered once, by fused_op_service(): not by this service.
    grpc::Service::MarkMethodGeneric(0);
    fused_op_service_ = options_.fused_op_api == ServiceOptions::FusedOpApi::kSync
                            ? MakeFusedOpService(this)
                            : std::unique_ptr<grpc::Service>(std::make_unique<AsyncFusedServe>());
  }
}

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
  metrics_->RecordRequest(rpc, op, GrpcCodeName(g.error_code()), absl::ToDoubleSeconds(FastNow() - start));
  reactor->Finish(g);
  CallFinished();
}

namespace {

constexpr char kFusedOpMethod[] = "/fusedserve.v1.FusedServe/FusedOp";
constexpr size_t kArenaBlock = 16 << 10;
constexpr size_t kPoolMax = 4096;  // FusedOpCall blocks kept for reuse

// FusedOp's sync-API handler (--fused_op_api=sync): what the generated code
// makes for a method (grpc::internal::RpcMethodHandler), on raw bodies, plus
// the "send" stage: the response's write until gRPC reports it done.
class FusedOpHandler final : public grpc::internal::MethodHandler {
 public:
  explicit FusedOpHandler(FusedServeService* service) : service_(service) {}

  void RunHandler(const HandlerParameter& param) override {
    grpc::ByteBuffer response;
    grpc::Status status = param.status;
    if (status.ok()) {
      auto* request = static_cast<grpc::ByteBuffer*>(param.request);
      status = service_->HandleFusedOp(static_cast<grpc::ServerContext*>(param.server_context), *request, &response);
      request->~ByteBuffer();
    }
    const absl::Time sending = FastNow();
    grpc::internal::UnaryRunHandlerHelper(param, &response, status);
    service_->metrics()->RecordStage(Metrics::Stage::kSend, absl::ToDoubleSeconds(FastNow() - sending));
  }

  void* Deserialize(grpc_call* call, grpc_byte_buffer* req, grpc::Status* status, void** /*handler_data*/) override {
    auto* request =
        new (grpc::g_core_codegen_interface->grpc_call_arena_alloc(call, sizeof(grpc::ByteBuffer))) grpc::ByteBuffer;
    return grpc::internal::UnaryDeserializeHelper(req, status, request);
  }

 private:
  FusedServeService* const service_;
};

class FusedOpService final : public grpc::Service {
 public:
  explicit FusedOpService(FusedServeService* service) {
    AddMethod(new grpc::internal::RpcServiceMethod(kFusedOpMethod, grpc::internal::RpcMethod::NORMAL_RPC,
                                                   new FusedOpHandler(service)));
  }
};

std::unique_ptr<grpc::Service> MakeFusedOpService(FusedServeService* service) {
  return std::make_unique<FusedOpService>(service);
}

// FusedOp messages live on this thread's protobuf arena, reset when the step
// that made them ends (the request once validated: its tensor bytes have
// moved into the OpRequest; the response once serialized): no per-message
// heap allocations once the arena's first block has grown.
google::protobuf::Arena& ThreadArena() {
  static thread_local std::unique_ptr<char[]> block(new char[kArenaBlock]);
  static thread_local google::protobuf::Arena arena([] {
    google::protobuf::ArenaOptions o;
    o.initial_block = block.get();
    o.initial_block_size = kArenaBlock;
    return o;
  }());
  return arena;
}

struct ResetArena {
  google::protobuf::Arena& arena;
  ~ResetArena() { arena.Reset(); }
};

// A response message into a raw body.
template <typename M>
absl::Status SerializeMessage(const M& message, grpc::ByteBuffer* out) {
  bool own = false;
  const grpc::Status g = grpc::SerializationTraits<M>::Serialize(message, out, &own);
  if (!g.ok()) return absl::InternalError(g.error_message());
  return absl::OkStatus();
}

}  // namespace

// One callback-API FusedOp: the reactor, from the handler to OnDone. Blocks
// are recycled (NewFusedOpCall / RecycleFusedOpCall), each use constructed
// afresh: a reactor's state must not outlive its call.
class FusedServeService::FusedOpCall final : public grpc::ServerUnaryReactor {
 public:
  explicit FusedOpCall(FusedServeService* service) : service_(service) {}

  void Start(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& raw_request, grpc::ByteBuffer* raw_response) {
    Metrics::DeferScope defer;  // this call's metric updates wait until Finish (an inline run writes the answer)
    start_ = FastNow();
    service_->CallStarted();
    response_ = raw_response;
    absl::StatusOr<OpRequest> request = service_->DecodeFusedOp(raw_request, start_, &op_);
    if (!request.ok()) return Done(request.status());
    OpTask task = service_->MakeFusedOpTask(*std::move(request), ctx, response_, &early_);
    // Called on this thread inside Submit (inline run) or on a worker.
    task.done = [this](absl::StatusOr<TensorMap> result) {
      Done(result.ok() ? service_->EncodeFusedOp(*std::move(result), response_, &early_) : result.status());
    };
    if (absl::Status s = service_->scheduler_->Submit(std::move(task)); !s.ok()) Done(s);
  }

  void OnDone() override {
    service_->metrics_->RecordStage(Metrics::Stage::kSend, absl::ToDoubleSeconds(FastNow() - sending_));
    service_->RecycleFusedOpCall(this);  // destroys this
  }

 private:
  void Done(const absl::Status& status) {
    const grpc::Status g = service_->FinishFusedOp(op_, start_, status);
    sending_ = FastNow();
    Finish(g);
  }

  FusedServeService* const service_;
  absl::Time start_;
  absl::Time sending_;
  std::string op_;
  grpc::ByteBuffer* response_ = nullptr;
  EarlyFusedOpResponse early_;
};

// The completion queue the calling thread polls (PollAsync), or nullptr.
static thread_local grpc::ServerCompletionQueue* t_polling_cq = nullptr;

// One async-API call slot (--fused_op_api=async): requested on its queue,
// run when a call arrives (on the polling thread; inline when the scheduler
// is idle), answered on its own queue's polling thread, then requested again
// once both the answer's completion and the call's done notice (which makes
// IsCancelled valid on the async API) have come back, in either order. No
// allocation per call.
//
// A result that comes from elsewhere (a batcher or scheduler worker) is
// handed back to the slot's polling thread through an alarm that fires at
// once: the worker only stores it, and the encoding and gRPC's write (which
// Finish performs on the calling thread) run on the polling threads, one per
// queue, in parallel, instead of one after another on the worker that ran a
// merged launch.
class FusedServeService::AsyncFusedOpSlot {
 public:
  AsyncFusedOpSlot(FusedServeService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq), async_(static_cast<AsyncFusedServe*>(service->fused_op_service_.get())) {}

  // Requests the next call unless the service is stopping.
  void Request() {
    service_->gate_.IfOpen([this] { RequestLocked(); });
  }

 private:
  void RequestLocked() {
    request_.Clear();
    response_.Clear();
    writer_.reset();
    ctx_.reset();
    ctx_.emplace();
    ctx_->AsyncNotifyWhenDone(&done_tag_);
    writer_.emplace(&*ctx_);
    answering_ = false;
    events_left_.store(2);  // once a call came: the answer's completion and the done notice
    async_->RequestUnary(AsyncFusedServe::kFusedOp, &*ctx_, &request_, &*writer_, cq_, &main_tag_);
  }

  // A queue event: one of a slot's three tags.
  enum class Kind { kMain, kDoneNotice, kResult };
  struct Tag final : CqTag {
    AsyncFusedOpSlot* slot;
    Kind kind;
    Tag(AsyncFusedOpSlot* s, Kind k) : slot(s), kind(k) {}
    void Proceed(bool ok) override {
      // This call's metric updates wait until its answer is written.
      Metrics::DeferScope defer;
      switch (kind) {
        case Kind::kDoneNotice:
          return slot->Event();
        case Kind::kResult:
          return slot->Answer(*std::move(slot->result_));
        case Kind::kMain:
          return slot->Proceed(ok);
      }
    }
  };

  void Proceed(bool ok) {
    if (answering_) {  // the answer has been sent (or the call is gone)
      if (ok) service_->metrics_->RecordStage(Metrics::Stage::kSend, absl::ToDoubleSeconds(FastNow() - sending_));
      return Event();
    }
    if (!ok) return;  // the server is shutting down: no call came
    answering_ = true;
    start_ = FastNow();
    service_->CallStarted();
    absl::StatusOr<OpRequest> request = service_->DecodeFusedOp(request_, start_, &op_);
    if (!request.ok()) return Done(request.status());
    OpTask task = service_->MakeFusedOpTask(*std::move(request), &*ctx_, &response_, &early_);
    task.done = [this](absl::StatusOr<TensorMap> result) { OnResult(std::move(result)); };
    task.answer_group = cq_;
    if (absl::Status s = service_->scheduler_->Submit(std::move(task)); !s.ok()) Done(s);
  }

  // The scheduler's answer: on this slot's polling thread (an inline run)
  // it is sent right away, else handed to that thread, unless the launch's
  // calls all share this queue: then its one thread could only send them one
  // after another, and sends them here instead (see LaunchAnswersShareOneGroup).
  void OnResult(absl::StatusOr<TensorMap> result) {
    if (t_polling_cq != cq_ && service_->options_.answer_on_poller && !LaunchAnswersShareOneGroup()) {
      const bool handed_over = service_->gate_.IfOpen([&] {  // the queue still takes events
        result_.emplace(std::move(result));
        handoff_.Set(cq_, gpr_time_0(GPR_CLOCK_MONOTONIC), &result_tag_);
      });
      if (handed_over) return;
    }
    Answer(std::move(result));
  }

  void Answer(absl::StatusOr<TensorMap> result) {
    result_.reset();
    Done(result.ok() ? service_->EncodeFusedOp(*std::move(result), &response_, &early_) : result.status());
  }

  // One of the call's two closing events; after both, the slot is free.
  void Event() {
    if (events_left_.fetch_sub(1) == 1) Request();
  }

  void Done(const absl::Status& status) {
    const grpc::Status g = service_->FinishFusedOp(op_, start_, status);
    sending_ = FastNow();
    if (g.ok()) {
      writer_->Finish(response_, g, &main_tag_);
    } else {
      writer_->FinishWithError(g, &main_tag_);
    }
  }

  FusedServeService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  AsyncFusedServe* const async_;
  Tag main_tag_{this, Kind::kMain};        // the call's arrival and its answer's completion
  Tag done_tag_{this, Kind::kDoneNotice};  // the call's done notice
  Tag result_tag_{this, Kind::kResult};    // a worker's result, handed over
  std::optional<grpc::ServerContext> ctx_;
  std::optional<grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>> writer_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  EarlyFusedOpResponse early_;
  grpc::Alarm handoff_;                              // reused: set again only after its event came
  std::optional<absl::StatusOr<TensorMap>> result_;  // set by a worker, read after the alarm's event
  // Touched by the slot's queue threads only (and by Done, which runs before
  // the events it causes): the queue orders the arrival, the answer and its
  // completion; the done notice may come at once with the completion on
  // another thread sharing the queue (--grpc_cqs), hence the atomic count.
  bool answering_ = false;
  std::atomic<int> events_left_{0};
  absl::Time start_;
  absl::Time sending_;
  std::string op_;
};

void FusedServeService::StartAsync(const std::vector<grpc::ServerCompletionQueue*>& cqs, int threads,
                                   AsyncHealth* health) {
  async_cqs_ = cqs;
  auto* async = static_cast<AsyncFusedServe*>(fused_op_service_.get());
  MakeAsyncHandlers();
  const int n_cqs = static_cast<int>(cqs.size());
  threads = std::max(threads, n_cqs);
  for (int q = 0; q < n_cqs; ++q) {
    grpc::ServerCompletionQueue* cq = cqs[q];
    const int cq_threads = threads / n_cqs + (q < threads % n_cqs ? 1 : 0);
    for (int i = 0; i < std::max(1, options_.async_calls_per_cq) * cq_threads; ++i) {
      async_slots_.push_back(std::make_unique<AsyncFusedOpSlot>(this, cq));
      async_slots_.back()->Request();
    }
    for (AsyncFusedServe::Method m : {AsyncFusedServe::kTransformerBlock, AsyncFusedServe::kGetServerInfo,
                                      AsyncFusedServe::kTokenize, AsyncFusedServe::kDetokenize}) {
      AsyncUnaryCall::Start(async, m, cq, &gate_, &unary_handlers_[m]);
    }
    AsyncGenerateCall::Start(async, cq, &gate_, &generate_handler_);
  }
  if (health != nullptr) health->Start(cqs, &gate_);
  if (options_.poll_spinners > 0) spin_slots_ = std::make_unique<SpinSlots>(options_.poll_spinners);
  for (int t = 0; t < threads; ++t) {
    grpc::ServerCompletionQueue* cq = cqs[t % n_cqs];
    async_threads_.emplace_back([this, cq] { PollAsync(cq); });
  }
}

void FusedServeService::PollAsync(grpc::ServerCompletionQueue* cq) {
  // Named, so per-thread CPU time (/proc/PID/task/*/stat, top -H) tells
  // the polling threads from the scheduler's workers.
  pthread_setname_np(pthread_self(), "fs-cq");
  t_polling_cq = cq;
  PollCompletionQueue(cq, options_.poll_spin, spin_slots_.get());
}

// The async API's unary handlers (FusedOp aside) and Generate's: each as its
// callback-API method below does it.
void FusedServeService::MakeAsyncHandlers() {
  // Ends a call: counts it and sends the answer (the call may be gone on return).
  auto finish = [this](AsyncUnaryCall* call, const char* rpc, absl::Time start, const absl::Status& status) {
    const grpc::Status g = ToGrpcStatus(status);
    metrics_->RecordRequest(rpc, "", GrpcCodeName(g.error_code()), absl::ToDoubleSeconds(FastNow() - start));
    CallFinished();
    call->Finish(g);
  };
  unary_handlers_[AsyncFusedServe::kTransformerBlock] = [this, finish](AsyncUnaryCall* call) {
    const absl::Time start = FastNow();
    CallStarted();
    if (absl::Status s = CheckAccepting(); !s.ok()) return finish(call, "TransformerBlock", start, s);
    auto messages = std::make_shared<std::pair<v1::TransformerBlockRequest, v1::TransformerBlockResponse>>();
    if (absl::Status s = ParseRequest(call->request(), "TransformerBlock", &messages->first); !s.ok()) {
      return finish(call, "TransformerBlock", start, s);
    }
    StartTransformerBlock(engine_.load(), &call->context(), &messages->first, &messages->second, options_.limits,
                          [finish, call, start, messages](const absl::Status& s) {
                            finish(call, "TransformerBlock", start,
                                   s.ok() ? SerializeMessage(messages->second, call->response()) : s);
                          });
  };
  unary_handlers_[AsyncFusedServe::kGetServerInfo] = [this, finish](AsyncUnaryCall* call) {
    const absl::Time start = FastNow();
    CallStarted();
    v1::GetServerInfoRequest request;
    if (absl::Status s = ParseRequest(call->request(), "GetServerInfo", &request); !s.ok()) {
      return finish(call, "GetServerInfo", start, s);
    }
    v1::GetServerInfoResponse response;
    {
      absl::MutexLock lock(&info_mu_);
      response = info_;
    }
    finish(call, "GetServerInfo", start, SerializeMessage(response, call->response()));
  };
  unary_handlers_[AsyncFusedServe::kTokenize] = [this, finish](AsyncUnaryCall* call) {
    const absl::Time start = FastNow();
    CallStarted();
    finish(call, "Tokenize", start, fusedserve::Tokenize(text_.load(), call->request(), call->response()));
  };
  unary_handlers_[AsyncFusedServe::kDetokenize] = [this, finish](AsyncUnaryCall* call) {
    const absl::Time start = FastNow();
    CallStarted();
    v1::DetokenizeRequest request;
    if (absl::Status s = ParseRequest(call->request(), "Detokenize", &request); !s.ok()) {
      return finish(call, "Detokenize", start, s);
    }
    v1::DetokenizeResponse response;
    absl::Status s = fusedserve::Detokenize(text_.load(), Vocab(), request, &response);
    finish(call, "Detokenize", start, s.ok() ? SerializeMessage(response, call->response()) : s);
  };
  generate_handler_ = [this](AsyncGenerateCall* call) {
    CallStarted();
    StartGenerate(engine_.load(), metrics_, text_.load(), CheckAccepting(),
                  absl::FromChrono(call->context().deadline()), call->request(), call, [this] { CallFinished(); });
  };
}

int64_t FusedServeService::Vocab() const {
  Engine* engine = engine_.load();
  const TextSupport* text = text_.load();
  return engine != nullptr                                 ? engine->config().vocab
         : text != nullptr && text->tokenizer() != nullptr ? text->tokenizer()->vocab_size()
                                                           : 0;
}

void FusedServeService::StopAsync() {
  if (!gate_.Close()) return;
  for (grpc::ServerCompletionQueue* cq : async_cqs_) cq->Shutdown();
  for (std::thread& t : async_threads_) t.join();
  async_threads_.clear();
}

FusedServeService::~FusedServeService() {
  StopAsync();
  absl::MutexLock lock(&pool_mu_);
  for (void* block : pool_) ::operator delete(block);
}

FusedServeService::FusedOpCall* FusedServeService::NewFusedOpCall() {
  void* block = nullptr;
  {
    absl::MutexLock lock(&pool_mu_);
    if (!pool_.empty()) {
      block = pool_.back();
      pool_.pop_back();
    }
  }
  if (block == nullptr) block = ::operator new(sizeof(FusedOpCall));
  return new (block) FusedOpCall(this);
}

void FusedServeService::RecycleFusedOpCall(FusedOpCall* call) {
  call->~FusedOpCall();
  absl::MutexLock lock(&pool_mu_);
  if (pool_.size() < kPoolMax) {
    pool_.push_back(call);
  } else {
    ::operator delete(call);
  }
}

grpc::Status FusedServeService::FinishFusedOp(const std::string& op, absl::Time start, const absl::Status& status) {
  const grpc::Status g = ToGrpcStatus(status);
  metrics_->RecordRequest("FusedOp", op, GrpcCodeName(g.error_code()), absl::ToDoubleSeconds(FastNow() - start));
  CallFinished();
  return g;
}

absl::StatusOr<OpRequest> FusedServeService::DecodeFusedOp(const grpc::ByteBuffer& raw_request, absl::Time start,
                                                           std::string* op) {
  *op = "unknown";
  if (options_.wire_codec) {
    // Straight from the slices (server/fused_op_wire.h); bodies it leaves
    // to protobuf take the path below.
    // The tensors go straight into the backend's staging memory where it
    // has some (CUDA: pinned, read in place by small kernels). Inputs take at
    // most the body's size and the outputs of the ops that stay there as
    // much again, plus each tensor's alignment (16 tensors' worth).
    static thread_local WireFusedOp wire;
    struct Drop {
      WireFusedOp& w;
      ~Drop() { w.DropStaging(); }  // the block goes with the request, not the thread
    } drop{wire};
    const size_t body = raw_request.Length();
    if (ParseFusedOpWire(raw_request, &wire, backend_->TakeStaging(2 * body + 16 * StagingBlock::kAlign))) {
      const absl::Time received = FastNow();
      metrics_->RecordStage(Metrics::Stage::kReceive, absl::ToDoubleSeconds(received - start));
      if (FindOpSpec(wire.op) != nullptr) *op = wire.op;
      if (absl::Status s = CheckAccepting(); !s.ok()) return s;
      absl::StatusOr<OpRequest> validated = ValidateWireFusedOp(wire, options_.limits);
      if (validated.ok()) metrics_->RecordStage(Metrics::Stage::kDecode, absl::ToDoubleSeconds(FastNow() - received));
      return validated;
    }
  }
  google::protobuf::Arena& arena = ThreadArena();
  ResetArena reset{arena};
  auto* request = google::protobuf::Arena::CreateMessage<v1::FusedOpRequest>(&arena);
  // Deserialize consumes its buffer; the copy shares the slices (no byte copy).
  grpc::ByteBuffer body(raw_request);
  if (!grpc::SerializationTraits<v1::FusedOpRequest>::Deserialize(&body, request).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FusedOp: the request body (", raw_request.Length(),
                     " bytes) is not a valid fusedserve.v1.FusedOpRequest; check that the client was generated from "
                     "this server's fusedserve/v1/fusedserve.proto and sends a FusedOpRequest to this method"));
  }
  const absl::Time received = FastNow();
  metrics_->RecordStage(Metrics::Stage::kReceive, absl::ToDoubleSeconds(received - start));
  // Label only known op names: arbitrary client strings must not create series.
  if (FindOpSpec(request->op()) != nullptr) *op = request->op();
  if (absl::Status s = CheckAccepting(); !s.ok()) return s;
  // The parsed request is not read again: its tensor bytes move into the
  // OpRequest instead of being copied.
  absl::StatusOr<OpRequest> validated = TakeValidatedFusedOp(*request, options_.limits);
  if (validated.ok()) metrics_->RecordStage(Metrics::Stage::kDecode, absl::ToDoubleSeconds(FastNow() - received));
  return validated;
}

OpTask FusedServeService::MakeFusedOpTask(OpRequest request, grpc::ServerContextBase* ctx,
                                          grpc::ByteBuffer* raw_response, EarlyFusedOpResponse* early) {
  OpTask task;
  task.request = std::move(request);
  if (early != nullptr && options_.wire_codec) {
    early->Arm(raw_response, &backend_name_);
    task.while_running = [early](const TensorMap& pending) { early->Encode(pending); };
  }
  task.enqueued = FastNow();
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
  return task;
}

absl::Status FusedServeService::EncodeFusedOp(TensorMap outputs, grpc::ByteBuffer* raw_response,
                                              EarlyFusedOpResponse* early) {
  const absl::Time start = FastNow();
  if (options_.wire_codec) {
    // Encoded while the GPU ran: only the outputs' bytes are left to copy.
    if (early == nullptr || !early->Complete(outputs))
      EncodeFusedOpWire(std::move(outputs), backend_name_, raw_response);
    metrics_->RecordStage(Metrics::Stage::kEncode, absl::ToDoubleSeconds(FastNow() - start));
    return absl::OkStatus();
  }
  google::protobuf::Arena& arena = ThreadArena();
  ResetArena reset{arena};
  auto* response = google::protobuf::Arena::CreateMessage<v1::FusedOpResponse>(&arena);
  for (auto& [name, t] : outputs) TensorToProto(std::move(t), &(*response->mutable_outputs())[name]);
  response->set_backend(backend_name_);
  bool own_buffer = false;
  const grpc::Status serialized =
      grpc::SerializationTraits<v1::FusedOpResponse>::Serialize(*response, raw_response, &own_buffer);
  metrics_->RecordStage(Metrics::Stage::kEncode, absl::ToDoubleSeconds(FastNow() - start));
  if (!serialized.ok()) return absl::InternalError("FusedOp: " + serialized.error_message());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* FusedServeService::FusedOp(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* raw_request,
                                                     grpc::ByteBuffer* raw_response) {
  FusedOpCall* call = NewFusedOpCall();
  call->Start(ctx, *raw_request, raw_response);
  return call;
}

grpc::Status FusedServeService::HandleFusedOp(grpc::ServerContext* ctx, const grpc::ByteBuffer& raw_request,
                                              grpc::ByteBuffer* raw_response) {
  const absl::Time start = FastNow();
  CallStarted();
  std::string op;
  absl::StatusOr<OpRequest> request = DecodeFusedOp(raw_request, start, &op);
  if (!request.ok()) return FinishFusedOp(op, start, request.status());
  // The scheduler answers through `done`: inside Submit when it runs the
  // request on this thread, else from a worker's launch while this waits.
  struct Wait {
    Wait(FusedServeService* s, grpc::ByteBuffer* r) : service(s), response(r) {}
    FusedServeService* service;
    grpc::ByteBuffer* response;
    EarlyFusedOpResponse early;
    absl::Status status = absl::UnknownError("FusedOp: no result");
    absl::Notification finished;
  } wait(this, raw_response);
  OpTask task = MakeFusedOpTask(*std::move(request), ctx, raw_response, &wait.early);
  task.done = [&wait](absl::StatusOr<TensorMap> result) {  // one pointer: no allocation
    wait.status =
        result.ok() ? wait.service->EncodeFusedOp(*std::move(result), wait.response, &wait.early) : result.status();
    wait.finished.Notify();
  };
  if (absl::Status s = scheduler_->Submit(std::move(task)); !s.ok()) return FinishFusedOp(op, start, s);
  wait.finished.WaitForNotification();
  return FinishFusedOp(op, start, wait.status);
}

grpc::ServerUnaryReactor* FusedServeService::TransformerBlock(grpc::CallbackServerContext* ctx,
                                                              const v1::TransformerBlockRequest* request,
                                                              v1::TransformerBlockResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = FastNow();
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
  GenerateStream* stream = nullptr;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor = NewCallbackGenerateStream(&stream);
  StartGenerate(engine_.load(), metrics_, text_.load(), CheckAccepting(), absl::FromChrono(ctx->deadline()),
                *raw_request, stream, [this] { CallFinished(); });
  return reactor;
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
  Finish(reactor, "GetServerInfo", "", FastNow(), absl::OkStatus());
  return reactor;
}

// Tokenize and Detokenize run on the gRPC thread: encoding is far cheaper
// than a queue hop, and needs no warm device.
grpc::ServerUnaryReactor* FusedServeService::Tokenize(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* raw_request,
                                                      grpc::ByteBuffer* raw_response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = FastNow();
  CallStarted();
  Finish(reactor, "Tokenize", "", start, fusedserve::Tokenize(text_.load(), *raw_request, raw_response));
  return reactor;
}

grpc::ServerUnaryReactor* FusedServeService::Detokenize(grpc::CallbackServerContext* ctx,
                                                        const v1::DetokenizeRequest* request,
                                                        v1::DetokenizeResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = FastNow();
  CallStarted();
  Finish(reactor, "Detokenize", "", start, fusedserve::Detokenize(text_.load(), Vocab(), *request, response));
  return reactor;
}

}  // namespace fusedserve
