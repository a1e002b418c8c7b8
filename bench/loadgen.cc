// fusedserve_loadgen: a gRPC load generator for fusedserve, in the spirit of
// Triton's perf_analyzer and ghz.
//
//   closed loop: --concurrency=N streams, each sends its next request when the
//                previous one returns (throughput at a fixed concurrency);
//   open loop:   --rate=R requests/s on a fixed schedule whatever the answers
//                (latency at a fixed load; latency counts from the scheduled
//                send time, so a stalled server is not hidden: no coordinated
//                omission).
// Either runs for --duration_s (after --warmup_s) or for --requests measured
// requests. --client_api picks how closed-loop streams call: callback (the
// gRPC callback API: 64 streams need no 64 threads; gRPC's own threads poll
// and run the completions) or sync (one thread per stream making blocking
// calls: the calling thread polls for its own answer, so a response reaches
// the next request with no thread hand-off; the lowest client overhead at low
// concurrency). The open loop always uses the callback API. The report names
// the API used.
// Reports throughput, p50/p90/p99/max latency and errors by gRPC code as a
// table and, with --json_out, as JSON. --metrics=HOST:PORT adds the server's
// mean batch size over the run (from fusedserve_batch_size).
//
//   fusedserve_loadgen --target=127.0.0.1:50051 --op=rms_norm --dtype=bf16
//       --shape=1,4096 --concurrency=64 --duration_s=10 --json_out=c64.json
//   fusedserve_loadgen --rpc=generate --prompt_len=16 --max_new_tokens=32 --concurrency=8
//   fusedserve_loadgen --rpc=generate --prompt_text="Tell me a story." --max_new_tokens=128 --concurrency=64
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "server/service.h"
#include "server/validation.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "fusedserve gRPC address HOST:PORT");
ABSL_FLAG(std::string, rpc, "fused_op", "fused_op or generate");
ABSL_FLAG(std::string, op, "rms_norm", "FusedOp: op name");
ABSL_FLAG(std::string, dtype, "bf16", "FusedOp: f32, f16 or bf16");
ABSL_FLAG(std::string, shape, "1,4096",
          "FusedOp: comma-separated op key (TuningKey order: norms M,H; softmax M,N; silu_and_mul M,I; gelu M,N; "
          "rope T,Hq,Hkv,D; linear M,N,K; swiglu_mlp M,D,I; attention T,Hq,Hkv,D; attention_decode B,L,Hq,Hkv,D)");
ABSL_FLAG(int, distinct_inputs, 8, "FusedOp: distinct random requests cycled through (weights shared)");
ABSL_FLAG(int, concurrency, 1, "Closed loop: concurrent streams (ignored when --rate > 0)");
ABSL_FLAG(double, rate, 0, "Open loop: requests per second (0: closed loop)");
ABSL_FLAG(int, max_outstanding, 100000,
          "Open loop: sends skipped (counted as CLIENT_BACKLOG) beyond this many in flight");
ABSL_FLAG(double, duration_s, 10, "Measured time, seconds (after the warm-up)");
ABSL_FLAG(int64_t, requests, 0, "Measured requests instead of a duration (0: use --duration_s)");
ABSL_FLAG(double, warmup_s, 1, "Unmeasured time before measuring, seconds");
ABSL_FLAG(std::string, client_api, "callback",
          "Closed loop: callback (gRPC callback API, gRPC threads) or sync (one thread per stream, blocking calls; "
          "fewest thread hand-offs, for latency at low concurrency). The open loop always uses callback");
ABSL_FLAG(int, connections, 0, "TCP connections (channels) used round-robin; 0 = min(concurrency, 8)");
ABSL_FLAG(double, deadline_ms, 10000, "Per-request deadline, ms");
ABSL_FLAG(bool, check, true, "Before the run, check each distinct FusedOp answer against the CPU reference");
ABSL_FLAG(double, wait_ready_s, 60, "Wait this long for the server to finish warming up");
ABSL_FLAG(int, prompt_len, 16, "Generate: prompt tokens");
ABSL_FLAG(int, shared_prefix_len, 0,
          "Generate: leading prompt tokens every request shares (a system prompt the server's prefix cache "
          "reuses); the rest is unique per request, so 0 measures prefills that nothing can reuse");
ABSL_FLAG(int, max_new_tokens, 16, "Generate: tokens to generate");
ABSL_FLAG(std::string, prompt_text, "",
          "Generate: a text prompt (the server's tokenizer encodes it and streams text back; eos is ignored so "
          "every request generates --max_new_tokens) instead of --prompt_len token ids");
ABSL_FLAG(std::string, metrics, "", "Server metrics HOST:PORT; adds the mean batch size over the run");
ABSL_FLAG(std::string, json_out, "", "Write the report as JSON to this file");
ABSL_FLAG(std::string, label, "", "Free text copied into the report (e.g. 'batching on')");

namespace fusedserve {
namespace {

using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// ---- request construction and checking -------------------------------------

bool ParseDType(const std::string& s, DType* out) {
  if (s == "f32")
    *out = DType::kF32;
  else if (s == "f16")
    *out = DType::kF16;
  else if (s == "bf16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

// Largest |got - want| / (1 + |want|) over every output.
double MaxError(const v1::FusedOpResponse& resp, const TensorMap& want) {
  double worst = 0;
  for (const auto& [name, w] : want) {
    auto it = resp.outputs().find(name);
    if (it == resp.outputs().end()) return INFINITY;
    absl::StatusOr<HostTensor> got = TensorFromProto(it->second, name, {});
    if (!got.ok() || got->shape != w.shape) return INFINITY;
    const std::vector<float> g = got->ToFloat(), e = w.ToFloat();
    for (size_t i = 0; i < g.size(); ++i) {
      const double err = std::fabs(double(g[i]) - double(e[i])) / (1.0 + std::fabs(double(e[i])));
      if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    }
  }
  return worst;
}

// ---- metrics scrape ----------------------------------------------------------

std::string HttpGet(const std::string& hostport, const std::string& path) {
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return "";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(hostport.substr(0, colon).c_str(), hostport.substr(colon + 1).c_str(), &hints, &res) != 0) {
    return "";
  }
  const int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  std::string response;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + hostport + "\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return response;
}

// Sum and count of fusedserve_batch_size for one op; {0,0} if absent.
std::pair<double, double> BatchSizeStats(const std::string& metrics, const std::string& op) {
  if (metrics.empty()) return {0, 0};
  const std::string body = HttpGet(metrics, "/metrics");
  double sum = 0, count = 0;
  const std::string label = "op=\"" + op + "\"";
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    const bool is_sum = absl::StartsWith(line, "fusedserve_batch_size_sum{");
    const bool is_count = absl::StartsWith(line, "fusedserve_batch_size_count{");
    if ((!is_sum && !is_count) || line.find(label) == absl::string_view::npos) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) (is_sum ? sum : count) = v;
  }
  return {sum, count};
}

// ---- the run -----------------------------------------------------------------

struct Sample {
  double latency_us;
  double ttft_us;  // Generate only
  int64_t tokens;  // Generate only
};

// Results of one stream (closed loop) or of the whole open-loop run.
struct Tally {
  std::vector<Sample> ok;
  std::map<std::string, int64_t> errors;
  Clock::time_point last_done{};
  std::string first_error;
};

class Loadgen {
 public:
  Loadgen() {
    const std::string target = absl::GetFlag(FLAGS_target);
    int connections = absl::GetFlag(FLAGS_connections);
    if (connections <= 0) connections = std::max(1, std::min(absl::GetFlag(FLAGS_concurrency), 8));
    for (int i = 0; i < connections; ++i) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      // Distinct arguments and a local pool: one TCP connection per channel.
      args.SetInt("fusedserve.loadgen_channel", i);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      stubs_.push_back(
          v1::FusedServe::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args)));
    }
    deadline_ = std::chrono::microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_deadline_ms) * 1000));
    generate_ = absl::GetFlag(FLAGS_rpc) == "generate";
  }

  // Builds the requests; checks answers against the CPU reference. Returns a
  // non-empty message on a fatal problem.
  std::string Prepare(nlohmann::json* report) {
    const std::string rpc = absl::GetFlag(FLAGS_rpc);
    if (rpc != "fused_op" && rpc != "generate") return "--rpc must be fused_op or generate";
    const std::string api = absl::GetFlag(FLAGS_client_api);
    if (api != "callback" && api != "sync") return "--client_api must be callback or sync";
    if (generate_) {
      gen_req_.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
      if (const std::string text = absl::GetFlag(FLAGS_prompt_text); !text.empty()) {
        gen_req_.set_prompt(text);
        gen_req_.set_ignore_eos(true);
      } else {
        for (int i = 0; i < absl::GetFlag(FLAGS_prompt_len); ++i) gen_req_.add_prompt_token_ids(1 + i % 1000);
      }
      gen_req_.set_temperature(0);
      gen_req_.set_seed(1);
      return WaitReadyGenerate();
    }
    const std::string op = absl::GetFlag(FLAGS_op);
    if (FindOpSpec(op) == nullptr) return "unknown --op '" + op + "'";
    DType dt;
    if (!ParseDType(absl::GetFlag(FLAGS_dtype), &dt)) return "--dtype must be f32, f16 or bf16";
    std::vector<int64_t> key;
    for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_shape), ',', absl::SkipWhitespace())) {
      int64_t v;
      if (!absl::SimpleAtoi(s, &v) || v < 1) return "bad --shape entry '" + std::string(s) + "'";
      key.push_back(v);
    }
    const size_t want_dims = op == "attention_decode"                 ? 5
                             : (op == "rope" || op == "attention")    ? 4
                             : (op == "linear" || op == "swiglu_mlp") ? 3
                                                                      : 2;
    if (key.size() != want_dims) return absl::StrCat("--shape for ", op, " needs ", want_dims, " numbers");
    const int n = std::max(1, absl::GetFlag(FLAGS_distinct_inputs));
    std::vector<OpRequest> reqs;
    for (int i = 0; i < n; ++i) {
      OpRequest r = MakeRandomRequest(op, dt, key, 1000 + i);
      if (i > 0) {  // the same weights, as a served model would have
        for (const auto& [name, t] : reqs.front().inputs) {
          if (name == "weight" || name == "bias" || name == "gate_up" || name == "down") r.inputs[name] = t;
        }
      }
      reqs.push_back(r);
      protos_.push_back(OpRequestToProto(r));
    }
    if (std::string err = WaitReady(); !err.empty()) return err;
    if (absl::GetFlag(FLAGS_check)) {
      std::unique_ptr<Backend> cpu = MakeCpuBackend();
      const double tol = dt == DType::kF32 ? 1e-3 : dt == DType::kF16 ? 1e-2 : 6e-2;
      double worst = 0;
      for (size_t i = 0; i < reqs.size(); ++i) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
        v1::FusedOpResponse resp;
        grpc::Status st = stubs_[0]->FusedOp(&ctx, protos_[i], &resp);
        if (!st.ok()) return "check request failed: " + GrpcCodeName(st.error_code()) + ": " + st.error_message();
        absl::StatusOr<TensorMap> want = cpu->Run(reqs[i]);
        if (!want.ok()) return "CPU reference failed: " + std::string(want.status().message());
        worst = std::max(worst, MaxError(resp, *want));
        if (i == 0) (*report)["backend"] = resp.backend();
      }
      (*report)["check_max_rel_error"] = worst;
      (*report)["check_tolerance"] = tol;
      if (!(worst <= tol)) return absl::StrCat("answers differ from the CPU reference: max error ", worst, " > ", tol);
    }
    return "";
  }

  // Runs the load; fills the report.
  void Run(nlohmann::json* report) {
    const double warmup = absl::GetFlag(FLAGS_warmup_s);
    const double duration = absl::GetFlag(FLAGS_duration_s);
    const int64_t count = absl::GetFlag(FLAGS_requests);
    const double rate = absl::GetFlag(FLAGS_rate);
    const std::string op = absl::GetFlag(FLAGS_op);
    start_ = Clock::now();
    warm_end_ = start_ + std::chrono::microseconds(static_cast<int64_t>(warmup * 1e6));
    measure_end_ = count > 0 ? Clock::time_point::max()
                             : warm_end_ + std::chrono::microseconds(static_cast<int64_t>(duration * 1e6));
    remaining_ = count > 0 ? count : -1;
    counted_ = count > 0;
    std::pair<double, double> batch0{0, 0};
    bool scraped = false;
    if (rate > 0) {
      RunOpenLoop(rate, &batch0, &scraped, op);
    } else {
      const int c = std::max(1, absl::GetFlag(FLAGS_concurrency));
      tallies_.resize(c);
      active_ = c;
      if (absl::GetFlag(FLAGS_client_api) == "sync") {
        std::vector<std::thread> streams;
        for (int i = 0; i < c; ++i) streams.emplace_back([this, i] { SyncStream(i); });
        WaitWarmupAndScrape(&batch0, &scraped, op);
        for (std::thread& t : streams) t.join();
      } else {
        for (int i = 0; i < c; ++i) Issue(i);
        WaitWarmupAndScrape(&batch0, &scraped, op);
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return active_ == 0; });
      }
    }
    const std::pair<double, double> batch1 =
        scraped ? BatchSizeStats(absl::GetFlag(FLAGS_metrics), op) : std::pair<double, double>{0, 0};
    Summarize(report, batch0, batch1, scraped);
  }

 private:
  std::string WaitReady() {
    const auto until =
        Clock::now() + std::chrono::microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_wait_ready_s) * 1e6));
    for (;;) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::FusedOpResponse resp;
      grpc::Status st = stubs_[0]->FusedOp(&ctx, protos_[0], &resp);
      if (st.error_code() != grpc::StatusCode::UNAVAILABLE) return "";
      if (Clock::now() > until) return "server not ready: " + st.error_message();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  std::string WaitReadyGenerate() {
    const auto until =
        Clock::now() + std::chrono::microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_wait_ready_s) * 1e6));
    for (;;) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::GetServerInfoResponse info;
      grpc::Status st = stubs_[0]->GetServerInfo(&ctx, {}, &info);
      if (st.ok() && !info.device().empty()) return "";  // the server fills it in once warm
      if (Clock::now() > until) return "server not ready: " + (st.ok() ? "still warming up" : st.error_message());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  void WaitWarmupAndScrape(std::pair<double, double>* batch0, bool* scraped, const std::string& op) {
    std::this_thread::sleep_until(warm_end_);
    if (!absl::GetFlag(FLAGS_metrics).empty() && !generate_) {
      *batch0 = BatchSizeStats(absl::GetFlag(FLAGS_metrics), op);
      *scraped = true;
    }
  }

  bool Measured(Clock::time_point t) const { return t >= warm_end_ && t < measure_end_; }

  // Claims the right to send one more request now; false when the run is over.
  bool MaySend(Clock::time_point now) {
    if (now >= measure_end_) return false;
    // (Not "remaining_ < 0": the count goes negative once the streams have
    // claimed the last request, and the rest of them must stop too.)
    if (!counted_ || now < warm_end_) return true;
    return remaining_.fetch_sub(1) > 0;
  }

  grpc::ClientContext* NewContext(std::unique_ptr<grpc::ClientContext>* holder) {
    *holder = std::make_unique<grpc::ClientContext>();
    (*holder)->set_deadline(std::chrono::system_clock::now() + deadline_);
    return holder->get();
  }

  v1::FusedServe::Stub* StubFor(size_t i) { return stubs_[i % stubs_.size()].get(); }

  // ---- closed loop ----
  struct StreamCall {
    std::unique_ptr<grpc::ClientContext> ctx;
    v1::FusedOpResponse resp;
  };

  void Issue(int stream) {
    const Clock::time_point now = Clock::now();
    if (!MaySend(now)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) cv_.notify_all();
      return;
    }
    Send(StubFor(stream), now, [this, stream](const grpc::Status& st, Clock::time_point start, const Sample& s) {
      Record(&tallies_[stream], st, start, s);
      Issue(stream);
    });
  }

  // A closed-loop stream on the sync API: blocking calls from this thread.
  void SyncStream(int stream) {
    v1::FusedServe::Stub* stub = StubFor(stream);
    Tally* tally = &tallies_[stream];
    for (;;) {
      const Clock::time_point start = Clock::now();
      if (!MaySend(start)) return;
      std::unique_ptr<grpc::ClientContext> ctx;
      NewContext(&ctx);
      grpc::Status st;
      Sample s{0, 0, 0};
      if (generate_) {
        const v1::GenerateRequest req = NextGenerateRequest();
        std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader = stub->Generate(ctx.get(), req);
        v1::GenerateResponse resp;
        while (reader->Read(&resp)) {
          if (s.tokens == 0 && resp.token_ids_size() > 0) s.ttft_us = Micros(Clock::now() - start);
          s.tokens += resp.token_ids_size();
        }
        st = reader->Finish();
      } else {
        const v1::FusedOpRequest& req = protos_[next_input_.fetch_add(1, std::memory_order_relaxed) % protos_.size()];
        v1::FusedOpResponse resp;
        st = stub->FusedOp(ctx.get(), req, &resp);
      }
      s.latency_us = Micros(Clock::now() - start);
      Record(tally, st, start, s);
    }
  }

  using DoneFn = std::function<void(const grpc::Status&, Clock::time_point start, const Sample&)>;

  // One request; `done` runs on a gRPC thread when it finishes.
  void Send(v1::FusedServe::Stub* stub, Clock::time_point start, DoneFn done) {
    if (generate_) {
      new GenerateCall(this, stub, start, std::move(done));
      return;
    }
    auto* call = new StreamCall;
    const v1::FusedOpRequest& req = protos_[next_input_.fetch_add(1, std::memory_order_relaxed) % protos_.size()];
    stub->async()->FusedOp(NewContext(&call->ctx), &req, &call->resp,
                           [call, start, done = std::move(done)](grpc::Status st) {
                             const Sample s{Micros(Clock::now() - start), 0, 0};
                             delete call;
                             done(st, start, s);
                           });
  }

  void Record(Tally* t, const grpc::Status& st, Clock::time_point start, const Sample& s) {
    if (!Measured(start)) return;
    if (st.ok()) {
      t->ok.push_back(s);
    } else {
      ++t->errors[GrpcCodeName(st.error_code())];
      if (t->first_error.empty()) t->first_error = GrpcCodeName(st.error_code()) + ": " + st.error_message();
    }
    t->last_done = std::max(t->last_done, Clock::now());
  }

  // A server-streaming Generate call.
  class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    GenerateCall(Loadgen* lg, v1::FusedServe::Stub* stub, Clock::time_point start, DoneFn done)
        : req_(lg->NextGenerateRequest()), start_(start), done_(std::move(done)) {
      lg->NewContext(&ctx_);
      stub->async()->Generate(ctx_.get(), &req_, this);
      StartRead(&resp_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;
      if (tokens_ == 0 && resp_.token_ids_size() > 0) ttft_us_ = Micros(Clock::now() - start_);
      tokens_ += resp_.token_ids_size();
      StartRead(&resp_);
    }
    void OnDone(const grpc::Status& st) override {
      const Sample s{Micros(Clock::now() - start_), ttft_us_, tokens_};
      DoneFn done = std::move(done_);
      const Clock::time_point start = start_;
      delete this;
      done(st, start, s);
    }

   private:
    const v1::GenerateRequest req_;  // this call's prompt (the reactor reads it until done)
    std::unique_ptr<grpc::ClientContext> ctx_;
    v1::GenerateResponse resp_;
    Clock::time_point start_;
    DoneFn done_;
    double ttft_us_ = 0;
    int64_t tokens_ = 0;
  };

  // ---- open loop ----
  void RunOpenLoop(double rate, std::pair<double, double>* batch0, bool* scraped, const std::string& op) {
    tallies_.resize(1);
    const int max_outstanding = absl::GetFlag(FLAGS_max_outstanding);
    std::thread scraper([&] { WaitWarmupAndScrape(batch0, scraped, op); });
    const std::chrono::duration<double> period(1.0 / rate);
    for (int64_t i = 0;; ++i) {
      const Clock::time_point when = start_ + std::chrono::duration_cast<Clock::duration>(period * i);
      std::this_thread::sleep_until(when);
      if (!MaySend(when)) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (outstanding_ >= max_outstanding) {
          if (Measured(when)) ++tallies_[0].errors["CLIENT_BACKLOG"];
          continue;
        }
        ++outstanding_;
      }
      // Latency counts from `when`, the scheduled send time.
      Send(StubFor(static_cast<size_t>(i)), when,
           [this](const grpc::Status& st, Clock::time_point start, const Sample& s) {
             std::lock_guard<std::mutex> lock(mu_);
             Record(&tallies_[0], st, start, s);
             if (--outstanding_ == 0) cv_.notify_all();
           });
    }
    scraper.join();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return outstanding_ == 0; });
  }

  // ---- report ----
  void Summarize(nlohmann::json* report, std::pair<double, double> batch0, std::pair<double, double> batch1,
                 bool scraped) {
    std::vector<double> lat, ttft;
    std::map<std::string, int64_t> errors;
    Clock::time_point last = warm_end_;
    int64_t tokens = 0;
    std::string first_error;
    for (const Tally& t : tallies_) {
      for (const Sample& s : t.ok) {
        lat.push_back(s.latency_us);
        if (generate_) ttft.push_back(s.ttft_us);
        tokens += s.tokens;
      }
      for (const auto& [code, n] : t.errors) errors[code] += n;
      last = std::max(last, t.last_done);
      if (first_error.empty()) first_error = t.first_error;
    }
    std::sort(lat.begin(), lat.end());
    std::sort(ttft.begin(), ttft.end());
    auto pct = [](const std::vector<double>& v, double p) {
      if (v.empty()) return 0.0;
      const size_t i = static_cast<size_t>(std::ceil(p / 100.0 * v.size()));
      return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
    };
    int64_t n_err = 0;
    for (const auto& [code, n] : errors) n_err += n;
    const double seconds = std::max(1e-9, std::chrono::duration<double>(last - warm_end_).count());
    double mean = 0;
    for (double x : lat) mean += x;
    mean = lat.empty() ? 0 : mean / lat.size();
    nlohmann::json& r = *report;
    r["ok"] = lat.size();
    r["errors"] = n_err;
    r["errors_by_code"] = errors;
    if (!first_error.empty()) r["first_error"] = first_error;
    r["measured_seconds"] = seconds;
    r["throughput_rps"] = lat.size() / seconds;
    r["latency_us"] = {{"p50", pct(lat, 50)},
                       {"p90", pct(lat, 90)},
                       {"p99", pct(lat, 99)},
                       {"max", lat.empty() ? 0.0 : lat.back()},
                       {"mean", mean}};
    if (generate_) {
      r["ttft_us"] = {{"p50", pct(ttft, 50)}, {"p90", pct(ttft, 90)}, {"p99", pct(ttft, 99)}};
      r["tokens_per_second"] = tokens / seconds;
    }
    if (scraped && batch1.second > batch0.second) {
      r["server_launches"] = batch1.second - batch0.second;
      r["server_mean_batch_size"] = (batch1.first - batch0.first) / (batch1.second - batch0.second);
    }
  }

  std::vector<std::unique_ptr<v1::FusedServe::Stub>> stubs_;
  std::vector<v1::FusedOpRequest> protos_;
  v1::GenerateRequest gen_req_;
  std::atomic<int64_t> gen_count_{0};

  // gen_req_ with the tokens after --shared_prefix_len made unique to this
  // call (a counter in base 499 in the first two of them), so only the
  // shared part can come from the server's prefix cache.
  v1::GenerateRequest NextGenerateRequest() {
    v1::GenerateRequest r = gen_req_;
    const int64_t n = gen_count_.fetch_add(1);
    const int shared = absl::GetFlag(FLAGS_shared_prefix_len);
    if (shared < r.prompt_token_ids_size()) r.set_prompt_token_ids(shared, static_cast<int32_t>(1 + n % 499));
    if (shared + 1 < r.prompt_token_ids_size()) {
      r.set_prompt_token_ids(shared + 1, static_cast<int32_t>(1 + (n / 499) % 499));
    }
    return r;
  }
  bool generate_ = false;
  std::chrono::microseconds deadline_{};
  std::atomic<uint64_t> next_input_{0};
  Clock::time_point start_, warm_end_, measure_end_;
  std::atomic<int64_t> remaining_{-1};
  bool counted_ = false;  // --requests: the run ends after remaining_ more sends
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;       // closed-loop streams still sending
  int outstanding_ = 0;  // open-loop requests in flight
  std::vector<Tally> tallies_;
};

void PrintTable(const nlohmann::json& r) {
  std::printf("%s\n", r["description"].get<std::string>().c_str());
  if (r.contains("device_name")) {
    std::printf("server: %s (%s)\n", r["device_name"].get<std::string>().c_str(),
                r["device"].get<std::string>().c_str());
  }
  std::printf("%10s %8s %12s %10s %10s %10s %10s %10s", "ok", "errors", "req/s", "p50_us", "p90_us", "p99_us", "max_us",
              "mean_us");
  const bool batch = r.contains("server_mean_batch_size");
  if (batch) std::printf(" %10s", "batch");
  std::printf("\n");
  const auto& l = r["latency_us"];
  std::printf("%10lld %8lld %12.0f %10.1f %10.1f %10.1f %10.1f %10.1f", r["ok"].get<long long>(),
              r["errors"].get<long long>(), r["throughput_rps"].get<double>(), l["p50"].get<double>(),
              l["p90"].get<double>(), l["p99"].get<double>(), l["max"].get<double>(), l["mean"].get<double>());
  if (batch) std::printf(" %10.2f", r["server_mean_batch_size"].get<double>());
  std::printf("\n");
  if (r.contains("ttft_us")) {
    std::printf("time to first token p50/p90/p99 us: %.1f / %.1f / %.1f; %.0f tokens/s\n",
                r["ttft_us"]["p50"].get<double>(), r["ttft_us"]["p90"].get<double>(), r["ttft_us"]["p99"].get<double>(),
                r["tokens_per_second"].get<double>());
  }
  for (const auto& [code, n] : r["errors_by_code"].items()) {
    std::printf("  errors %-20s %lld\n", code.c_str(), n.get<long long>());
  }
  if (r.contains("first_error")) std::printf("  first error: %s\n", r["first_error"].get<std::string>().c_str());
}

int Main() {
  nlohmann::json report;
  const double rate = absl::GetFlag(FLAGS_rate);
  const bool generate = absl::GetFlag(FLAGS_rpc) == "generate";
  const std::string prompt = absl::GetFlag(FLAGS_prompt_text).empty()
                                 ? absl::StrCat(absl::GetFlag(FLAGS_prompt_len))
                                 : absl::StrCat("text(", absl::GetFlag(FLAGS_prompt_text).size(), " bytes)");
  const std::string what = generate
                               ? absl::StrCat("Generate prompt=", prompt, " new=", absl::GetFlag(FLAGS_max_new_tokens))
                               : absl::StrCat("FusedOp ", absl::GetFlag(FLAGS_op), " ", absl::GetFlag(FLAGS_dtype),
                                              " [", absl::GetFlag(FLAGS_shape), "]");
  // The open loop sends on a schedule, which only the callback API can do.
  const std::string api = rate > 0 ? "callback" : absl::GetFlag(FLAGS_client_api);
  const std::string mode = rate > 0 ? absl::StrCat("open loop ", rate, " req/s")
                                    : absl::StrCat("closed loop c=", absl::GetFlag(FLAGS_concurrency));
  const std::string span = absl::GetFlag(FLAGS_requests) > 0 ? absl::StrCat(absl::GetFlag(FLAGS_requests), " requests")
                                                             : absl::StrCat(absl::GetFlag(FLAGS_duration_s), " s");
  report["description"] = absl::StrCat(what, ", ", mode, " (", api, " client API), ", span, " after ",
                                       absl::GetFlag(FLAGS_warmup_s), " s warm-up -> ", absl::GetFlag(FLAGS_target));
  report["client_api"] = api;
  report["target"] = absl::GetFlag(FLAGS_target);
  report["rpc"] = absl::GetFlag(FLAGS_rpc);
  report["op"] = absl::GetFlag(FLAGS_op);
  report["dtype"] = absl::GetFlag(FLAGS_dtype);
  report["shape"] = absl::GetFlag(FLAGS_shape);
  report["mode"] = rate > 0 ? "open" : "closed";
  report["concurrency"] = absl::GetFlag(FLAGS_concurrency);
  report["rate"] = rate;
  report["label"] = absl::GetFlag(FLAGS_label);

  Loadgen lg;
  if (std::string err = lg.Prepare(&report); !err.empty()) {
    std::fprintf(stderr, "fusedserve_loadgen: %s\n", err.c_str());
    return 1;
  }
  {
    auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetServerInfoResponse info;
    if (v1::FusedServe::NewStub(channel)->GetServerInfo(&ctx, {}, &info).ok()) {
      report["device"] = info.device();
      report["device_name"] = info.device_name();
      report["server_version"] = info.version();
    }
  }
  lg.Run(&report);
  PrintTable(report);
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    out << report.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "fusedserve_loadgen: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
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
  absl::SetProgramUsageMessage(
      "fusedserve_loadgen --target=HOST:PORT [--op=rms_norm --dtype=bf16 --shape=1,4096] "
      "[--concurrency=N | --rate=R] [--duration_s=S | --requests=N] [--json_out=FILE]");
  absl::ParseCommandLine(argc, argv);
  return fusedserve::Main();
}
