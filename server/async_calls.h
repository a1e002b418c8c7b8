// Every RPC of the server on gRPC's async API (completion queues), for
// --fused_op_api=async: then the only threads that poll gRPC's sockets are
// the queues' own. A server with any callback-API method (gRPC's default
// health service is one) also gets gRPC 1.51's callback queue and its
// "nexting" threads, which poll the same sockets (epoll1 has one epoll set
// for the process): a call they read is handed to its queue's thread, one
// more wake-up per call (bench/run_grpc_floor.sh: echo-async vs
// echo-async-health). Server reflection stays on the sync API: next to async
// queues gRPC makes its queue non-polling, so its threads never read sockets.
//
// Here: the raw async FusedServe service, per-call objects for its unary
// methods and for Generate's stream, and grpc.health.v1.Health (Check and
// Watch) with the default health service's answers.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/model_rpc.h"
#include "server/spin_slots.h"

namespace fusedserve {

// What a completion-queue tag points at: Proceed runs on the queue's polling
// thread with the event's ok bit.
class CqTag {
 public:
  virtual void Proceed(bool ok) = 0;

 protected:
  ~CqTag() = default;
};

// A call's tag for one of its events: hands (event, ok) to call->OnEvent.
// The calls befriend it (OnEvent is theirs alone).
template <typename Call, typename Event>
class CallTag final : public CqTag {
 public:
  CallTag(Call* call, Event event) : call_(call), event_(event) {}
  void Proceed(bool ok) override { call_->OnEvent(event_, ok); }

 private:
  Call* const call_;
  const Event event_;
};

// Polls `cq` until it is shut down and drained, running each tag. After
// each event the thread keeps polling without blocking for `spin` (0: it
// blocks at once), yielding the core between polls: a thread that blocks
// sleeps, and on a VM its idle vCPU halts and exits to the hypervisor, whose
// wake-up on the next request costs tens of microseconds (2-core machine,
// c=1: the same server 129-134 us p50 with its cores free to halt, 88-90
// with idle-priority spinners keeping them awake). Idle queues still block.
// With `slots` (SpinSlots), a thread spins only while it holds one of them
// (nullptr: no bound).
void PollCompletionQueue(grpc::ServerCompletionQueue* cq, absl::Duration spin = absl::ZeroDuration(),
                         SpinSlots* slots = nullptr);

// Closes the queues to new requests: calls re-request their method only
// while Open() (under its lock, so that no request reaches a queue that is
// shutting down).
class CqGate {
 public:
  // Runs `request` unless the gate is closed; false when closed.
  bool IfOpen(const std::function<void()>& request) {
    absl::ReaderMutexLock lock(&mu_);
    if (closed_) return false;
    request();
    return true;
  }
  // True the first time only.
  bool Close() {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    closed_ = true;
    return true;
  }
  bool closed() {
    absl::ReaderMutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// fusedserve.v1.FusedServe with every method raw (bytes in, bytes out) on
// the async API.
class AsyncFusedServe final : public grpc::Service {
 public:
  enum Method { kFusedOp, kTransformerBlock, kGenerate, kGetServerInfo, kTokenize, kDetokenize };
  AsyncFusedServe();
  void RequestUnary(Method m, grpc::ServerContext* ctx, grpc::ByteBuffer* request,
                    grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
                    void* tag) {
    RequestAsyncUnary(m, ctx, request, writer, cq, cq, tag);
  }
  void RequestStream(Method m, grpc::ServerContext* ctx, grpc::ByteBuffer* request,
                     grpc::ServerAsyncWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq, void* tag) {
    RequestAsyncServerStreaming(m, ctx, request, writer, cq, cq, tag);
  }
};

// One call of a unary method other than FusedOp (allocated per call; FusedOp
// has its own recycled slots). Requested on a queue; when it arrives the
// next call of the method is requested and `handler` runs on the polling
// thread; the handler (or whatever it hands the call to, on any thread)
// ends it with Finish once.
class AsyncUnaryCall final {
 public:
  using Handler = std::function<void(AsyncUnaryCall* call)>;
  // Requests the first call of `method` on `cq`.
  static void Start(AsyncFusedServe* service, AsyncFusedServe::Method method, grpc::ServerCompletionQueue* cq,
                    CqGate* gate, const Handler* handler);

  grpc::ServerContext& context() { return ctx_; }
  const grpc::ByteBuffer& request() const { return request_; }
  grpc::ByteBuffer* response() { return &response_; }
  // Sends the response (on OK) or the status.
  void Finish(const grpc::Status& status);

 private:
  AsyncUnaryCall(AsyncFusedServe* service, AsyncFusedServe::Method method, grpc::ServerCompletionQueue* cq,
                 CqGate* gate, const Handler* handler);
  void Request();
  void OnMain(bool ok);
  void Closed();  // one of the two closing events (the answer's completion, the done notice)
  void OnEvent(bool done_notice, bool ok) { done_notice ? Closed() : OnMain(ok); }

  using Tag = CallTag<AsyncUnaryCall, bool>;  // event: whether it is the done notice
  friend Tag;
  AsyncFusedServe* const service_;
  const AsyncFusedServe::Method method_;
  grpc::ServerCompletionQueue* const cq_;
  CqGate* const gate_;
  const Handler* const handler_;
  Tag main_tag_{this, false};
  Tag done_tag_{this, true};
  grpc::ServerContext ctx_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_{&ctx_};
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  bool arrived_ = false;
  std::atomic<int> closing_events_{2};  // threads sharing a queue may take two events at once
};

// One Generate call on a queue: the GenerateStream (server/model_rpc.h) of
// the async API. On arrival the next Generate call is requested and
// `handler` attaches the stream's events (StartGenerate).
class AsyncGenerateCall final : public GenerateStream {
 public:
  using Handler = std::function<void(AsyncGenerateCall* call)>;
  static void Start(AsyncFusedServe* service, grpc::ServerCompletionQueue* cq, CqGate* gate, const Handler* handler);

  grpc::ServerContext& context() { return ctx_; }
  const grpc::ByteBuffer& request() const { return request_; }

  void Write(const grpc::ByteBuffer* message) override { writer_.Write(*message, &write_tag_); }
  void End(const grpc::Status& status) override { writer_.Finish(status, &finish_tag_); }

 private:
  AsyncGenerateCall(AsyncFusedServe* service, grpc::ServerCompletionQueue* cq, CqGate* gate, const Handler* handler);
  void Request();
  enum class Kind { kArrival, kWrite, kFinish, kDoneNotice };
  void OnEvent(Kind kind, bool ok);

  using Tag = CallTag<AsyncGenerateCall, Kind>;
  friend Tag;
  AsyncFusedServe* const service_;
  grpc::ServerCompletionQueue* const cq_;
  CqGate* const gate_;
  const Handler* const handler_;
  Tag arrival_tag_{this, Kind::kArrival};
  Tag write_tag_{this, Kind::kWrite};
  Tag finish_tag_{this, Kind::kFinish};
  Tag done_tag_{this, Kind::kDoneNotice};
  grpc::ServerContext ctx_;
  grpc::ServerAsyncWriter<grpc::ByteBuffer> writer_{&ctx_};
  grpc::ByteBuffer request_;
  // The Finish's completion and the done notice: atomic, as threads sharing
  // a queue (--grpc_cqs) may take the two events at once.
  std::atomic<int> closing_events_{2};
};

// grpc.health.v1.Health on the async API, with the answers of gRPC's default
// health service: Check says SERVING / NOT_SERVING for a known service name
// ("" is the server's) and NOT_FOUND otherwise; Watch sends the status
// (SERVICE_UNKNOWN for an unknown name) and then every change. Its state is
// the server's HealthCheckServiceInterface (HealthCheckServiceServerBuilderOption).
class AsyncHealth final : public grpc::HealthCheckServiceInterface {
 public:
  AsyncHealth();
  ~AsyncHealth() override;
  // The service to register with the server builder (owned by this).
  grpc::Service* service() { return service_.get(); }
  // Once the server has started: requests Check and Watch on each queue.
  void Start(const std::vector<grpc::ServerCompletionQueue*>& cqs, CqGate* gate);

  void SetServingStatus(const std::string& service_name, bool serving) override;
  void SetServingStatus(bool serving) override;
  void Shutdown() override;

  class CheckCall;
  class WatchCall;

 private:
  // 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN (grpc.health.v1's enum).
  int Status(const std::string& service_name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify(const std::string& service_name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<grpc::Service> service_;
  mutable absl::Mutex mu_;
  std::map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<WatchCall*> watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusedserve
