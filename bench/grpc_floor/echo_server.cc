// fusedserve_grpc_floor_server: the gRPC floor of a FusedOp round trip. A
// bare fusedserve.v1.FusedServe server that answers FusedOp with a copy of
// its input "x" as output "y" (no validation, no compute), on one of gRPC's
// three C++ server models:
//   sync      grpc::Service: gRPC's thread manager polls and runs the handler
//             on the polling thread (--threads caps the pollers);
//   callback  CallbackService: the reactor finishes inline in the callback;
//   async     AsyncService on --threads completion queues, one dedicated
//             polling thread per queue (Triton's gRPC front end), each queue
//             keeping --calls_per_cq FusedOp calls requested per thread;
//             --cqs=N shares N queues among the threads instead (round
//             robin); --spin polls the queue with a zero timeout instead of
//             sleeping in it; --spin_us=N does so for N us after each
//             event, then sleeps (fusedserve's --grpc_poll_spin_us), at
//             most --spinners threads at once (--grpc_poll_spinners).
// Channel/server arguments under test: --max_concurrent_streams,
// --minimal_stack, --quota_threads (a ResourceQuota's thread cap) and
// --bdp_probe. GetServerInfo answers device "echo-<model>".
// Run by bench/run_grpc_floor.sh against the same load generator and message
// as fusedserve.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "server/spin_slots.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50300", "HOST:PORT");
ABSL_FLAG(std::string, model, "async", "sync, callback or async");
ABSL_FLAG(int, threads, 0, "async: completion queues (one polling thread each); sync: max pollers; 0 = cores");
ABSL_FLAG(int, calls_per_cq, 64, "async: FusedOp calls kept requested on each completion queue, per polling thread");
ABSL_FLAG(int, cqs, 0, "async: completion queues shared by the --threads polling threads (0: one per thread)");
ABSL_FLAG(bool, spin, false, "async: poll the queues with a zero timeout (busy) instead of blocking");
ABSL_FLAG(int, spin_us, 0,
          "async: after each event keep polling with a zero timeout for this long, yielding between polls, then "
          "block (fusedserve's --grpc_poll_spin_us)");
ABSL_FLAG(int, spinners, 0,
          "async with --spin_us: at most this many threads spin at once, the others block after each event "
          "(fusedserve's --grpc_poll_spinners); 0: no bound");
ABSL_FLAG(int, max_concurrent_streams, 0, "GRPC_ARG_MAX_CONCURRENT_STREAMS (0: gRPC's default)");
ABSL_FLAG(bool, minimal_stack, false, "GRPC_ARG_MINIMAL_STACK (no deadline/census filters)");
ABSL_FLAG(int, quota_threads, 0, "ResourceQuota::SetMaxThreads (0: none)");
ABSL_FLAG(int, bdp_probe, -1, "GRPC_ARG_HTTP2_BDP_PROBE (-1: gRPC's default)");
ABSL_FLAG(bool, health, false,
          "Also serve gRPC's default health service (callback API in gRPC 1.51), as a real server does: with "
          "--model=sync or async the server then has two kinds of polling threads");

namespace fusedserve {
namespace {

using v1::FusedOpRequest;
using v1::FusedOpResponse;

// The whole "op": output y is a copy of input x.
void Echo(const FusedOpRequest& request, FusedOpResponse* response) {
  auto it = request.inputs().find("x");
  if (it != request.inputs().end()) (*response->mutable_outputs())["y"] = it->second;
  response->set_backend("echo");
}

std::string DeviceName() {
  return "echo-" + absl::GetFlag(FLAGS_model) + (absl::GetFlag(FLAGS_health) ? "+health" : "");
}

class SyncEcho final : public v1::FusedServe::Service {
  grpc::Status FusedOp(grpc::ServerContext*, const FusedOpRequest* request, FusedOpResponse* response) override {
    Echo(*request, response);
    return grpc::Status::OK;
  }
  grpc::Status GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                             v1::GetServerInfoResponse* response) override {
    response->set_device(DeviceName());
    return grpc::Status::OK;
  }
};

class CallbackEcho final : public v1::FusedServe::CallbackService {
  grpc::ServerUnaryReactor* FusedOp(grpc::CallbackServerContext* ctx, const FusedOpRequest* request,
                                    FusedOpResponse* response) override {
    Echo(*request, response);
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx, const v1::GetServerInfoRequest*,
                                          v1::GetServerInfoResponse* response) override {
    response->set_device(DeviceName());
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

// Async: every method is requested on the queues (an unrequested async
// method would leave its calls pending forever).
class AsyncCall {
 public:
  virtual ~AsyncCall() = default;
  virtual void Proceed(bool ok) = 0;
};

// One reusable call slot: request, answer, request again (no allocation per call).
template <typename Req, typename Resp, auto kRequest>
class UnarySlot final : public AsyncCall {
 public:
  UnarySlot(v1::FusedServe::AsyncService* service, grpc::ServerCompletionQueue* cq) : service_(service), cq_(cq) {
    Request();
  }
  void Proceed(bool ok) override {
    if (!ok) return;  // the queue is shutting down
    if (!answering_) {
      answering_ = true;
      if constexpr (std::is_same_v<Req, FusedOpRequest>) {
        Echo(request_, &response_);
      } else {
        response_.set_device(DeviceName());
      }
      responder_->Finish(response_, grpc::Status::OK, this);
      return;
    }
    Request();
  }

 private:
  void Request() {
    answering_ = false;
    request_.Clear();
    response_.Clear();
    responder_.reset();
    ctx_.reset();
    ctx_.emplace();
    responder_.emplace(&*ctx_);
    (service_->*kRequest)(&*ctx_, &request_, &*responder_, cq_, cq_, this);
  }

  v1::FusedServe::AsyncService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  bool answering_ = false;
  std::optional<grpc::ServerContext> ctx_;
  std::optional<grpc::ServerAsyncResponseWriter<Resp>> responder_;
  Req request_;
  Resp response_;
};

using FusedOpSlot = UnarySlot<FusedOpRequest, FusedOpResponse, &v1::FusedServe::AsyncService::RequestFusedOp>;
using InfoSlot =
    UnarySlot<v1::GetServerInfoRequest, v1::GetServerInfoResponse, &v1::FusedServe::AsyncService::RequestGetServerInfo>;

// `slots`: --spinners (nullptr: no bound).
void Poll(grpc::ServerCompletionQueue* cq, bool spin, int spin_us, fusedserve::SpinSlots* slots) {
  void* tag = nullptr;
  bool ok = false;
  if (!spin && spin_us > 0) {
    bool holds = slots == nullptr;
    auto spin_until = std::chrono::steady_clock::time_point::min();
    for (;;) {
      const bool spinning = holds && std::chrono::steady_clock::now() < spin_until;
      if (!spinning && holds && slots != nullptr) {
        slots->Release();
        holds = false;
      }
      const auto r =
          cq->AsyncNext(&tag, &ok, spinning ? gpr_time_0(GPR_CLOCK_MONOTONIC) : gpr_inf_future(GPR_CLOCK_MONOTONIC));
      if (r == grpc::CompletionQueue::SHUTDOWN) return;
      if (r == grpc::CompletionQueue::GOT_EVENT) {
        static_cast<AsyncCall*>(tag)->Proceed(ok);
        if (!holds) holds = slots->TryAcquire();
        spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
      } else {
        sched_yield();
      }
    }
  }
  if (!spin) {
    while (cq->Next(&tag, &ok)) static_cast<AsyncCall*>(tag)->Proceed(ok);
    return;
  }
  for (;;) {
    const auto r = cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
    if (r == grpc::CompletionQueue::SHUTDOWN) return;
    if (r == grpc::CompletionQueue::GOT_EVENT) static_cast<AsyncCall*>(tag)->Proceed(ok);
  }
}

int Main() {
  const std::string model = absl::GetFlag(FLAGS_model);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (absl::GetFlag(FLAGS_health)) grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(512 << 20);
  builder.SetMaxSendMessageSize(512 << 20);
  if (int n = absl::GetFlag(FLAGS_max_concurrent_streams); n > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, n);
  }
  if (absl::GetFlag(FLAGS_minimal_stack)) builder.AddChannelArgument(GRPC_ARG_MINIMAL_STACK, 1);
  if (int b = absl::GetFlag(FLAGS_bdp_probe); b >= 0) builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, b);
  if (int n = absl::GetFlag(FLAGS_quota_threads); n > 0) {
    grpc::ResourceQuota quota("echo");
    quota.SetMaxThreads(n);
    builder.SetResourceQuota(quota);
  }

  SyncEcho sync_service;
  CallbackEcho callback_service;
  v1::FusedServe::AsyncService async_service;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  if (model == "sync") {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, threads);
    builder.RegisterService(&sync_service);
  } else if (model == "callback") {
    builder.RegisterService(&callback_service);
  } else if (model == "async") {
    builder.RegisterService(&async_service);
    int n = absl::GetFlag(FLAGS_cqs);
    n = n <= 0 ? threads : std::min(n, threads);
    for (int i = 0; i < n; ++i) cqs.push_back(builder.AddCompletionQueue());
  } else {
    std::fprintf(stderr, "--model must be sync, callback or async\n");
    return 2;
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "cannot listen on %s\n", absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  std::fprintf(stderr, "echo server (%s, %d threads) on port %d\n", model.c_str(), threads, port);
  std::vector<std::unique_ptr<AsyncCall>> slots;
  std::unique_ptr<fusedserve::SpinSlots> spin_slots;
  if (absl::GetFlag(FLAGS_spinners) > 0)
    spin_slots = std::make_unique<fusedserve::SpinSlots>(absl::GetFlag(FLAGS_spinners));
  std::vector<std::thread> pollers;
  for (size_t q = 0; q < cqs.size(); ++q) {
    const int cq_threads =
        threads / static_cast<int>(cqs.size()) + (static_cast<int>(q) < threads % static_cast<int>(cqs.size()) ? 1 : 0);
    for (int i = 0; i < absl::GetFlag(FLAGS_calls_per_cq) * cq_threads; ++i) {
      slots.push_back(std::make_unique<FusedOpSlot>(&async_service, cqs[q].get()));
    }
    slots.push_back(std::make_unique<InfoSlot>(&async_service, cqs[q].get()));
  }
  for (int t = 0; t < (cqs.empty() ? 0 : threads); ++t) {
    pollers.emplace_back(Poll, cqs[t % cqs.size()].get(), absl::GetFlag(FLAGS_spin), absl::GetFlag(FLAGS_spin_us),
                         spin_slots.get());
  }
  // Runs until killed (a benchmark fixture; no drain).
  server->Wait();
  return 0;
}

}  // namespace
}  // namespace fusedserve

int main(int argc, char** argv) {
  // Debian's Abseil is built without NDEBUG, which leaves absl::Mutex's
  // deadlock detection on: every lock and unlock (gRPC's own included) then
  // updates a process-wide lock graph under one global lock. A debugging aid
  // that serialises every thread; off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage("fusedserve_grpc_floor_server --model=sync|callback|async [--threads=N] --listen=H:P");
  absl::ParseCommandLine(argc, argv);
  return fusedserve::Main();
}
