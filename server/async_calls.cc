#include "server/async_calls.h"

#include <sched.h>

#include <algorithm>
#include <atomic>

#include "google/protobuf/unknown_field_set.h"
#include "kernels/clock.h"

namespace fusedserve {

void PollCompletionQueue(grpc::ServerCompletionQueue* cq, absl::Duration spin, SpinSlots* slots) {
  void* tag = nullptr;
  bool ok = false;
  if (spin <= absl::ZeroDuration()) {
    while (cq->Next(&tag, &ok)) static_cast<CqTag*>(tag)->Proceed(ok);
    return;
  }
  bool holds_slot = slots == nullptr;
  absl::Time spin_until = absl::InfinitePast();
  for (;;) {
    const bool spinning = holds_slot && FastNow() < spin_until;
    if (!spinning && holds_slot && slots != nullptr) {
      slots->Release();  // its window is over: another thread may spin
      holds_slot = false;
    }
    // A past deadline still polls the queue's connections once, without waiting.
    switch (
        cq->AsyncNext(&tag, &ok, spinning ? gpr_time_0(GPR_CLOCK_MONOTONIC) : gpr_inf_future(GPR_CLOCK_MONOTONIC))) {
      case grpc::CompletionQueue::SHUTDOWN:
        if (holds_slot && slots != nullptr) slots->Release();
        return;
      case grpc::CompletionQueue::GOT_EVENT:
        static_cast<CqTag*>(tag)->Proceed(ok);
        if (!holds_slot) holds_slot = slots->TryAcquire();
        spin_until = FastNow() + spin;
        break;
      case grpc::CompletionQueue::TIMEOUT:
        sched_yield();  // other threads (a client on the same host, the other queues) run first
        break;
    }
  }
}

// ---- FusedServe --------------------------------------------------------------

AsyncFusedServe::AsyncFusedServe() {
  // In the proto's order (Method).
  const struct {
    const char* name;
    grpc::internal::RpcMethod::RpcType type;
  } methods[] = {
      {"/fusedserve.v1.FusedServe/FusedOp", grpc::internal::RpcMethod::NORMAL_RPC},
      {"/fusedserve.v1.FusedServe/TransformerBlock", grpc::internal::RpcMethod::NORMAL_RPC},
      {"/fusedserve.v1.FusedServe/Generate", grpc::internal::RpcMethod::SERVER_STREAMING},
      {"/fusedserve.v1.FusedServe/GetServerInfo", grpc::internal::RpcMethod::NORMAL_RPC},
      {"/fusedserve.v1.FusedServe/Tokenize", grpc::internal::RpcMethod::NORMAL_RPC},
      {"/fusedserve.v1.FusedServe/Detokenize", grpc::internal::RpcMethod::NORMAL_RPC},
  };
  for (size_t i = 0; i < std::size(methods); ++i) {
    AddMethod(new grpc::internal::RpcServiceMethod(methods[i].name, methods[i].type, nullptr));
    grpc::Service::MarkMethodRaw(static_cast<int>(i));
  }
}

// ---- unary calls -------------------------------------------------------------

AsyncUnaryCall::AsyncUnaryCall(AsyncFusedServe* service, AsyncFusedServe::Method method,
                               grpc::ServerCompletionQueue* cq, CqGate* gate, const Handler* handler)
    : service_(service), method_(method), cq_(cq), gate_(gate), handler_(handler) {}

void AsyncUnaryCall::Start(AsyncFusedServe* service, AsyncFusedServe::Method method, grpc::ServerCompletionQueue* cq,
                           CqGate* gate, const Handler* handler) {
  (new AsyncUnaryCall(service, method, cq, gate, handler))->Request();
}

void AsyncUnaryCall::Request() {
  const bool requested = gate_->IfOpen([this] {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    service_->RequestUnary(method_, &ctx_, &request_, &writer_, cq_, &main_tag_);
  });
  if (!requested) delete this;
}

void AsyncUnaryCall::OnMain(bool ok) {
  if (arrived_) return Closed();  // the answer's completion
  if (!ok) {                      // the server is shutting down: no call came (and no done notice will)
    delete this;
    return;
  }
  arrived_ = true;
  Start(service_, method_, cq_, gate_, handler_);  // the method's next call
  (*handler_)(this);
}

void AsyncUnaryCall::Finish(const grpc::Status& status) {
  if (status.ok()) {
    writer_.Finish(response_, status, &main_tag_);
  } else {
    writer_.FinishWithError(status, &main_tag_);
  }
}

void AsyncUnaryCall::Closed() {
  if (closing_events_.fetch_sub(1) == 1) delete this;
}

// ---- Generate ----------------------------------------------------------------

AsyncGenerateCall::AsyncGenerateCall(AsyncFusedServe* service, grpc::ServerCompletionQueue* cq, CqGate* gate,
                                     const Handler* handler)
    : service_(service), cq_(cq), gate_(gate), handler_(handler) {}

void AsyncGenerateCall::Start(AsyncFusedServe* service, grpc::ServerCompletionQueue* cq, CqGate* gate,
                              const Handler* handler) {
  (new AsyncGenerateCall(service, cq, gate, handler))->Request();
}

void AsyncGenerateCall::Request() {
  const bool requested = gate_->IfOpen([this] {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    service_->RequestStream(AsyncFusedServe::kGenerate, &ctx_, &request_, &writer_, cq_, &arrival_tag_);
  });
  if (!requested) delete this;
}

void AsyncGenerateCall::OnEvent(Kind kind, bool ok) {
  switch (kind) {
    case Kind::kArrival:
      if (!ok) {  // the server is shutting down: no call came (and no done notice will)
        delete this;
        return;
      }
      Start(service_, cq_, gate_, handler_);  // the next call
      (*handler_)(this);                      // attaches events
      return;
    case Kind::kWrite:
      events->OnWriteDone(ok);
      return;
    case Kind::kDoneNotice:
      // Valid here on the async API: cancelled by the client, its deadline
      // or the server's shutdown.
      if (ctx_.IsCancelled()) events->OnCancel();
      break;
    case Kind::kFinish:
      break;
  }
  if (closing_events_.fetch_sub(1) == 1) {
    events->OnDone();
    delete this;
  }
}

// ---- health ------------------------------------------------------------------

namespace {

constexpr int kServing = 1, kNotServing = 2, kServiceUnknown = 3;
enum HealthMethod { kCheck, kWatch };

class AsyncHealthService final : public grpc::Service {
 public:
  AsyncHealthService() {
    AddMethod(new grpc::internal::RpcServiceMethod("/grpc.health.v1.Health/Check",
                                                   grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
    AddMethod(new grpc::internal::RpcServiceMethod("/grpc.health.v1.Health/Watch",
                                                   grpc::internal::RpcMethod::SERVER_STREAMING, nullptr));
    grpc::Service::MarkMethodRaw(kCheck);
    grpc::Service::MarkMethodRaw(kWatch);
  }
  void RequestCheck(grpc::ServerContext* ctx, grpc::ByteBuffer* request,
                    grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
                    void* tag) {
    RequestAsyncUnary(kCheck, ctx, request, writer, cq, cq, tag);
  }
  void RequestWatch(grpc::ServerContext* ctx, grpc::ByteBuffer* request,
                    grpc::ServerAsyncWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq, void* tag) {
    RequestAsyncServerStreaming(kWatch, ctx, request, writer, cq, cq, tag);
  }
};

// HealthCheckRequest {string service = 1;} -> the service name; false when
// the body does not parse.
bool ParseHealthRequest(const grpc::ByteBuffer& raw, std::string* service) {
  std::vector<grpc::Slice> slices;
  if (!raw.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) return false;
  service->clear();
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.number() != 1) continue;
    if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) return false;
    *service = f.length_delimited();  // the last one wins, as in protobuf
  }
  return true;
}

// HealthCheckResponse {ServingStatus status = 1;}.
grpc::ByteBuffer HealthResponse(int status) {
  const char bytes[2] = {0x08, static_cast<char>(status)};
  grpc::Slice slice(bytes, sizeof(bytes));
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

// One Check call (allocated per call).
class AsyncHealth::CheckCall final {
 public:
  static void Start(AsyncHealth* health, grpc::ServerCompletionQueue* cq, CqGate* gate) {
    (new CheckCall(health, cq, gate))->Request();
  }

 private:
  CheckCall(AsyncHealth* health, grpc::ServerCompletionQueue* cq, CqGate* gate)
      : health_(health), cq_(cq), gate_(gate) {}
  void Request() {
    const bool requested = gate_->IfOpen([this] {
      ctx_.AsyncNotifyWhenDone(&done_tag_);
      static_cast<AsyncHealthService*>(health_->service())->RequestCheck(&ctx_, &request_, &writer_, cq_, &main_tag_);
    });
    if (!requested) delete this;
  }
  void OnMain(bool ok) {
    if (arrived_) return Closed();
    if (!ok) {
      delete this;
      return;
    }
    arrived_ = true;
    Start(health_, cq_, gate_);
    std::string name;
    if (!ParseHealthRequest(request_, &name)) {
      writer_.FinishWithError(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "could not parse request"), &main_tag_);
      return;
    }
    int status = 0;
    {
      absl::MutexLock lock(&health_->mu_);
      status = health_->Status(name);
    }
    if (status == kServiceUnknown) {
      writer_.FinishWithError(grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown"), &main_tag_);
      return;
    }
    writer_.Finish(HealthResponse(status), grpc::Status::OK, &main_tag_);
  }
  void Closed() {
    if (closing_events_.fetch_sub(1) == 1) delete this;
  }
  void OnEvent(bool done_notice, bool ok) { done_notice ? Closed() : OnMain(ok); }

  using Tag = CallTag<CheckCall, bool>;  // event: whether it is the done notice
  friend Tag;
  AsyncHealth* const health_;
  grpc::ServerCompletionQueue* const cq_;
  CqGate* const gate_;
  Tag main_tag_{this, false};
  Tag done_tag_{this, true};
  grpc::ServerContext ctx_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_{&ctx_};
  grpc::ByteBuffer request_;
  bool arrived_ = false;
  std::atomic<int> closing_events_{2};  // threads sharing a queue may take two events at once
};

// One Watch call: sends the status, then each change (one write in flight;
// a change during a write is sent after it, latest status only), until the
// client cancels or the server shuts down. State under the health's mu_.
class AsyncHealth::WatchCall final {
 public:
  static void Start(AsyncHealth* health, grpc::ServerCompletionQueue* cq, CqGate* gate) {
    (new WatchCall(health, cq, gate))->Request();
  }

  // Under health_->mu_: `status` is the service's new status.
  void Changed(int status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_->mu_) {
    pending_ = status;
    MaybeWrite();
  }
  const std::string& name() const { return name_; }

 private:
  WatchCall(AsyncHealth* health, grpc::ServerCompletionQueue* cq, CqGate* gate)
      : health_(health), cq_(cq), gate_(gate) {}
  void Request() {
    const bool requested = gate_->IfOpen([this] {
      ctx_.AsyncNotifyWhenDone(&done_tag_);
      static_cast<AsyncHealthService*>(health_->service())->RequestWatch(&ctx_, &request_, &writer_, cq_, &arrival_);
    });
    if (!requested) delete this;
  }
  enum class Kind { kArrival, kWrite, kFinish, kDoneNotice };
  void OnEvent(Kind kind, bool ok) {
    switch (kind) {
      case Kind::kArrival: {
        if (!ok) {
          delete this;
          return;
        }
        Start(health_, cq_, gate_);
        absl::MutexLock lock(&health_->mu_);
        if (!ParseHealthRequest(request_, &name_)) {
          FinishLocked(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "could not parse request"));
          return;
        }
        health_->watches_.push_back(this);
        watching_ = true;
        pending_ = health_->Status(name_);
        MaybeWrite();
        return;
      }
      case Kind::kWrite: {
        absl::MutexLock lock(&health_->mu_);
        writing_ = false;
        if (finish_wanted_) {
          FinishLocked(finish_status_);
        } else if (!ok) {
          FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the stream is gone"));
        } else {
          MaybeWrite();
        }
        return;
      }
      case Kind::kDoneNotice: {
        absl::MutexLock lock(&health_->mu_);
        Unwatch();
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
        break;
      }
      case Kind::kFinish:
        break;
    }
    if (closing_events_.fetch_sub(1) == 1) delete this;
  }

  void MaybeWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_->mu_) {
    if (writing_ || finished_ || pending_ == 0) return;
    if (pending_ == sent_) {
      pending_ = 0;
      return;
    }
    message_ = HealthResponse(pending_);
    sent_ = pending_;
    pending_ = 0;
    writing_ = true;
    writer_.Write(message_, &write_);
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_->mu_) {
    if (finished_) return;
    if (writing_) {  // ends once the write in flight completes
      finish_wanted_ = true;
      finish_status_ = status;
      return;
    }
    finished_ = true;
    Unwatch();
    writer_.Finish(status, &finish_);
  }
  void Unwatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_->mu_) {
    if (!watching_) return;
    watching_ = false;
    auto& w = health_->watches_;
    w.erase(std::remove(w.begin(), w.end(), this), w.end());
  }

  using Tag = CallTag<WatchCall, Kind>;
  friend Tag;
  AsyncHealth* const health_;
  grpc::ServerCompletionQueue* const cq_;
  CqGate* const gate_;
  Tag arrival_{this, Kind::kArrival};
  Tag write_{this, Kind::kWrite};
  Tag finish_{this, Kind::kFinish};
  Tag done_tag_{this, Kind::kDoneNotice};
  grpc::ServerContext ctx_;
  grpc::ServerAsyncWriter<grpc::ByteBuffer> writer_{&ctx_};
  grpc::ByteBuffer request_;
  grpc::ByteBuffer message_;
  std::string name_;
  bool watching_ = false;
  bool writing_ = false;
  bool finished_ = false;
  bool finish_wanted_ = false;
  grpc::Status finish_status_;
  int sent_ = 0;                        // the last status written (0: none yet)
  int pending_ = 0;                     // the status to write next (0: none)
  std::atomic<int> closing_events_{2};  // threads sharing a queue may take two events at once
};

AsyncHealth::AsyncHealth() : service_(std::make_unique<AsyncHealthService>()) {
  absl::MutexLock lock(&mu_);
  serving_[""] = true;  // as gRPC's default service: the server's own name, SERVING
}

AsyncHealth::~AsyncHealth() = default;

void AsyncHealth::Start(const std::vector<grpc::ServerCompletionQueue*>& cqs, CqGate* gate) {
  for (grpc::ServerCompletionQueue* cq : cqs) {
    CheckCall::Start(this, cq, gate);
    WatchCall::Start(this, cq, gate);
  }
}

int AsyncHealth::Status(const std::string& service_name) const {
  auto it = serving_.find(service_name);
  if (it == serving_.end()) return kServiceUnknown;
  return it->second ? kServing : kNotServing;
}

void AsyncHealth::Notify(const std::string& service_name) {
  const int status = Status(service_name);
  for (WatchCall* w : watches_) {
    if (w->name() == service_name) w->Changed(status);
  }
}

void AsyncHealth::SetServingStatus(const std::string& service_name, bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  serving_[service_name] = serving;
  Notify(service_name);
}

void AsyncHealth::SetServingStatus(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  for (auto& [name, s] : serving_) {
    s = serving;
    Notify(name);
  }
}

void AsyncHealth::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  for (auto& [name, s] : serving_) {
    s = false;
    Notify(name);
  }
  shut_down_ = true;
}

}  // namespace fusedserve
