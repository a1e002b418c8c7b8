#include "telemetry/metrics.h"

#include <atomic>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "telemetry/log.h"

namespace fusedserve {
namespace {

using prometheus::Histogram;

// Latency buckets from 10 µs to 60 s: FusedOp round trips on a GPU sit at
// tens of µs, generation requests at seconds.
Histogram::BucketBoundaries LatencyBuckets() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
          5e-2, 0.1,    0.25, 0.5,  1,      2.5,  5,    10,     30,   60};
}

// Stage buckets from 1 µs to 1 s: a FusedOp's stages on a GPU take
// microseconds each.
Histogram::BucketBoundaries StageBuckets() {
  return {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1, 1};
}

Histogram::BucketBoundaries BatchBuckets() { return {1, 2, 4, 8, 16, 32, 64, 128, 256}; }

// HOST of HOST:PORT names the loopback interface (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::atomic<uint64_t> g_next_metrics_id{1};

// The updates a Metrics::DeferScope holds on this thread.
struct DeferredUpdates {
  struct Update {
    Histogram* histogram;          // observes value, or else
    prometheus::Counter* counter;  // is incremented
    double value;
  };
  bool active = false;
  int n = 0;
  Update updates[Metrics::kMaxDeferred];
};
thread_local DeferredUpdates t_deferred;

void Observe(Histogram& h, double value) {
  DeferredUpdates& d = t_deferred;
  if (d.active && d.n < Metrics::kMaxDeferred) {
    d.updates[d.n++] = {&h, nullptr, value};
    return;
  }
  h.Observe(value);
}

void Increment(prometheus::Counter& c) {
  DeferredUpdates& d = t_deferred;
  if (d.active && d.n < Metrics::kMaxDeferred) {
    d.updates[d.n++] = {nullptr, &c, 0};
    return;
  }
  c.Increment();
}

// The series of `family` for one set of label values, looked up once per
// thread. prometheus-cpp's Family::Add builds a label map, hashes it and
// takes the family's mutex on every call; the FusedOp path records several
// labelled series per request from every polling thread, so the lookups are
// cached here (keyed by the Metrics instance, the family and the values;
// families never remove series, so the pointers stay valid).
template <typename T, typename Make>
T& CachedSeries(uint64_t metrics_id, const void* family, std::initializer_list<absl::string_view> values, Make make) {
  char key[256];
  size_t n = 0;
  auto put = [&](const void* p, size_t size) {
    if (n + size + 1 > sizeof(key)) return false;
    std::memcpy(key + n, p, size);
    n += size;
    key[n++] = '\x1f';
    return true;
  };
  put(&metrics_id, sizeof(metrics_id));
  put(&family, sizeof(family));
  for (absl::string_view v : values) {
    if (!put(v.data(), v.size())) return make();  // a very long label value: uncached
  }
  static thread_local absl::flat_hash_map<std::string, T*> cache;
  auto it = cache.find(absl::string_view(key, n));
  if (it != cache.end()) return *it->second;
  T& series = make();
  if (cache.size() < 4096) cache.emplace(std::string(key, n), &series);
  return series;
}

}  // namespace

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()), id_(g_next_metrics_id.fetch_add(1)) {
  auto& r = *registry_;
  requests_ = &prometheus::BuildCounter()
                   .Name("fusedserve_requests_total")
                   .Help("Finished RPCs by method, op (FusedOp only) and gRPC status code")
                   .Register(r);
  request_duration_ = &prometheus::BuildHistogram()
                           .Name("fusedserve_request_duration_seconds")
                           .Help("Server-side RPC latency from arrival to response, seconds")
                           .Register(r);
  queue_duration_ = &prometheus::BuildHistogram()
                         .Name("fusedserve_queue_duration_seconds")
                         .Help("Time a FusedOp request waited before its launch, seconds")
                         .Register(r);
  batch_size_ = &prometheus::BuildHistogram()
                     .Name("fusedserve_batch_size")
                     .Help("Requests merged into one kernel launch")
                     .Register(r);
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("fusedserve_queue_depth")
                      .Help("FusedOp requests queued and not yet launched")
                      .Register(r);
  queued_bytes_ = &prometheus::BuildGauge()
                       .Name("fusedserve_queued_bytes")
                       .Help("Input bytes held by queued FusedOp requests (bounded by --max_queued_bytes)")
                       .Register(r)
                       .Add({});
  kernel_duration_ = &prometheus::BuildHistogram()
                          .Name("fusedserve_kernel_duration_seconds")
                          .Help("Backend execution time of one launch (transfers included), seconds")
                          .Register(r);
  tuning_rejected_ = &prometheus::BuildCounter()
                          .Name("fusedserve_tuning_cache_rejected_total")
                          .Help("Tuning cache files or candidate configs rejected, by reason")
                          .Register(r);
  ready_ = &prometheus::BuildGauge()
                .Name("fusedserve_ready")
                .Help("1 once warm-up has finished and the server reports SERVING")
                .Register(r)
                .Add({});
  warmup_seconds_ = &prometheus::BuildGauge()
                         .Name("fusedserve_warmup_duration_seconds")
                         .Help("Wall time of start-up warm-up (cache load, tuning, first runs), seconds")
                         .Register(r)
                         .Add({});
  tuning_hits_ = &prometheus::BuildCounter()
                      .Name("fusedserve_tuning_cache_hits_total")
                      .Help("Envelope entries found in the tuning cache")
                      .Register(r)
                      .Add({});
  tuning_misses_ = &prometheus::BuildCounter()
                        .Name("fusedserve_tuning_cache_misses_total")
                        .Help("Envelope entries missing from the tuning cache")
                        .Register(r)
                        .Add({});
  tuning_benchmarks_ = &prometheus::BuildCounter()
                            .Name("fusedserve_tuning_benchmarks_total")
                            .Help("Candidate kernel configs timed by the autotuner")
                            .Register(r)
                            .Add({});
  gpu_memory_ = &prometheus::BuildGauge()
                     .Name("fusedserve_gpu_memory_used_bytes")
                     .Help("GPU memory in use on the server's device, bytes")
                     .Register(r)
                     .Add({});
  ttft_ = &prometheus::BuildHistogram()
               .Name("fusedserve_time_to_first_token_seconds")
               .Help("Generate: arrival to first generated token, seconds")
               .Register(r)
               .Add({}, LatencyBuckets());
  tpot_ = &prometheus::BuildHistogram()
               .Name("fusedserve_time_per_output_token_seconds")
               .Help("Generate: mean time per generated token after the first, seconds")
               .Register(r)
               .Add({}, LatencyBuckets());
  auto& tokenizer =
      prometheus::BuildHistogram()
          .Name("fusedserve_tokenizer_seconds")
          .Help("Generate: tokenizer time per request (op encode: the prompt; decode: the stream), seconds")
          .Register(r);
  const prometheus::Histogram::BucketBoundaries tok_buckets = {1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3,
                                                               3e-3, 1e-2, 3e-2, 0.1,  0.3,  1.0};
  tok_encode_ = &tokenizer.Add({{"op", "encode"}}, tok_buckets);
  tok_decode_ = &tokenizer.Add({{"op", "decode"}}, tok_buckets);
  token_send_ = &prometheus::BuildHistogram()
                     .Name("fusedserve_generate_token_send_seconds")
                     .Help("Generate: time from a token being sampled to the stream message carrying it being sent")
                     .Register(r)
                     .Add({}, StageBuckets());
  auto& engine_step = prometheus::BuildHistogram()
                          .Name("fusedserve_engine_step_seconds")
                          .Help(
                              "Generate engine steps: part forward (one forward pass of the batch), part between "
                              "(from the end of one forward pass to the start of the next while sequences run)")
                          .Register(r);
  engine_forward_ = &engine_step.Add({{"part", "forward"}}, StageBuckets());
  engine_between_ = &engine_step.Add({{"part", "between"}}, StageBuckets());
  auto& stages =
      prometheus::BuildHistogram()
          .Name("fusedserve_fused_op_stage_seconds")
          .Help("FusedOp latency breakdown by stage (receive, decode, queue, h2d, kernel, d2h, encode, send)")
          .Register(r);
  const char* const kStageNames[kStages] = {"receive", "decode", "queue", "h2d", "kernel", "d2h", "encode", "send"};
  for (int i = 0; i < kStages; ++i) stages_[i] = &stages.Add({{"stage", kStageNames[i]}}, StageBuckets());
  inline_launches_ = &prometheus::BuildCounter()
                          .Name("fusedserve_inline_launches_total")
                          .Help("FusedOp launches run on the gRPC thread that received the request")
                          .Register(r)
                          .Add({});
  prompt_tokens_ = &prometheus::BuildCounter()
                        .Name("fusedserve_prompt_tokens_total")
                        .Help("Prompt tokens processed by Generate")
                        .Register(r)
                        .Add({});
  generated_tokens_ = &prometheus::BuildCounter()
                           .Name("fusedserve_generated_tokens_total")
                           .Help("Tokens generated by Generate")
                           .Register(r)
                           .Add({});
  running_ = &prometheus::BuildGauge()
                  .Name("fusedserve_requests_running")
                  .Help("Generate sequences in the running batch")
                  .Register(r)
                  .Add({});
  waiting_ = &prometheus::BuildGauge()
                  .Name("fusedserve_requests_waiting")
                  .Help("Generate requests waiting for KV-cache space or a batch slot")
                  .Register(r)
                  .Add({});
  kv_used_ = &prometheus::BuildGauge()
                  .Name("fusedserve_kv_cache_blocks_used")
                  .Help("KV-cache blocks in use")
                  .Register(r)
                  .Add({});
  kv_total_ = &prometheus::BuildGauge()
                   .Name("fusedserve_kv_cache_blocks_total")
                   .Help("KV-cache blocks available in total")
                   .Register(r)
                   .Add({});
  kv_cached_ = &prometheus::BuildGauge()
                    .Name("fusedserve_kv_cache_blocks_cached")
                    .Help("KV-cache blocks that no sequence holds, kept by the prefix cache for reuse (evictable)")
                    .Register(r)
                    .Add({});
  kv_shared_ = &prometheus::BuildGauge()
                    .Name("fusedserve_kv_cache_blocks_shared")
                    .Help("KV-cache blocks held by more than one sequence (prefix caching)")
                    .Register(r)
                    .Add({});
  prefix_hit_tokens_ = &prometheus::BuildCounter()
                            .Name("fusedserve_prefix_cache_hit_tokens_total")
                            .Help("Prompt tokens whose K/V came from the prefix cache instead of a prefill")
                            .Register(r)
                            .Add({});
}

absl::Status Metrics::Serve(const MetricsServeOptions& o) {
  if (o.threads < 1) return absl::InvalidArgumentError("--metrics_threads must be at least 1");
  if (o.request_timeout_ms < 1) return absl::InvalidArgumentError("--metrics_request_timeout_ms must be at least 1");
  const std::vector<std::string> options = {
      "listening_ports",
      o.listen,
      "num_threads",
      std::to_string(o.threads),
      "request_timeout_ms",
      std::to_string(o.request_timeout_ms),
      // One request per connection: a scraper idling between scrapes on a
      // kept-alive connection would hold a worker thread.
      "enable_keep_alive",
      "no",
  };
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(options);
  } catch (const std::exception& e) {
    return absl::UnavailableError("cannot serve metrics on " + o.listen + ": " + e.what());
  }
  exposer_->RegisterCollectable(registry_);
  // No HTTPS here: Debian's civetweb 1.15 loads OpenSSL by dlopen with the
  // 1.1 symbol table, and under OpenSSL 3 its workers call a null
  // SSL_get_peer_certificate on the first HTTPS connection (the process
  // crashes). Binding to a private address is the protection.
  if (o.grpc_uses_tls && !IsLoopback(o.listen)) {
    LogWarning("gRPC uses TLS but /metrics is plain HTTP on " + o.listen +
               ": whoever reaches that address can read it; bind --metrics_listen to 127.0.0.1 or a "
               "pod-internal address and restrict it with a NetworkPolicy");
  }
  return absl::OkStatus();
}

Metrics::DeferScope::DeferScope() : outermost_(!t_deferred.active) { t_deferred.active = true; }

Metrics::DeferScope::~DeferScope() {
  if (!outermost_) return;
  DeferredUpdates& d = t_deferred;
  d.active = false;
  for (int i = 0; i < d.n; ++i) {
    const DeferredUpdates::Update& u = d.updates[i];
    if (u.histogram != nullptr) {
      u.histogram->Observe(u.value);
    } else {
      u.counter->Increment();
    }
  }
  d.n = 0;
}

void Metrics::RecordStage(Stage stage, double seconds) { Observe(*stages_[static_cast<int>(stage)], seconds); }

void Metrics::RecordRequest(const std::string& rpc, const std::string& op, const std::string& code, double seconds) {
  Increment(CachedSeries<prometheus::Counter>(id_, requests_, {rpc, op, code}, [&]() -> prometheus::Counter& {
    return requests_->Add({{"rpc", rpc}, {"op", op}, {"code", code}});
  }));
  Observe(CachedSeries<Histogram>(id_, request_duration_, {rpc, op},
                                  [&]() -> Histogram& {
                                    return request_duration_->Add({{"rpc", rpc}, {"op", op}}, LatencyBuckets());
                                  }),
          seconds);
}

void Metrics::RecordQueue(const std::string& op, double seconds) {
  Observe(CachedSeries<Histogram>(id_, queue_duration_, {op},
                                  [&]() -> Histogram& {
                                    return queue_duration_->Add({{"op", op}}, LatencyBuckets());
                                  }),
          seconds);
  RecordStage(Stage::kQueue, seconds);
}

void Metrics::RecordBatch(const std::string& op, int requests) {
  Observe(CachedSeries<Histogram>(id_, batch_size_, {op},
                                  [&]() -> Histogram& {
                                    return batch_size_->Add({{"op", op}}, BatchBuckets());
                                  }),
          requests);
}

void Metrics::RecordKernel(const std::string& op, double seconds) {
  Observe(CachedSeries<Histogram>(id_, kernel_duration_, {op},
                                  [&]() -> Histogram& {
                                    return kernel_duration_->Add({{"op", op}}, LatencyBuckets());
                                  }),
          seconds);
}

prometheus::Gauge& Metrics::QueueDepth(const std::string& op) {
  return CachedSeries<prometheus::Gauge>(id_, queue_depth_, {op}, [&]() -> prometheus::Gauge& {
    return queue_depth_->Add({{"op", op}});
  });
}

}  // namespace fusedserve
