// Prometheus metrics of the server (names and labels as in docs/metrics.md and
// docs/metrics.md). One Metrics object per process; every method is
// thread-safe. The HTTP exposer is optional (tests may run without it).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace fusedserve {

// The /metrics HTTP server (civetweb under prometheus-cpp's Exposer). Every
// connection holds one worker thread until its request is read and answered,
// so idle or slow clients can occupy at most `threads` workers for at most
// request_timeout_ms each; scrapes queue behind them, never fail outright.
struct MetricsServeOptions {
  std::string listen;             // HOST:PORT
  int threads = 16;               // civetweb workers (prometheus-cpp's default of 2 let 2 idle sockets blind it)
  int request_timeout_ms = 5000;  // per request, reading it and writing the answer (civetweb's default 30 s)
  bool grpc_uses_tls = false;     // only for the warning about plain /metrics on a routable address
};

class Metrics {
 public:
  Metrics();

  // Starts the /metrics endpoint.
  absl::Status Serve(const MetricsServeOptions& options);

  // One finished RPC: code is the gRPC status code name, e.g. "OK", "INVALID_ARGUMENT".
  void RecordRequest(const std::string& rpc, const std::string& op, const std::string& code, double seconds);
  // Also observed as the "queue" stage below.
  void RecordQueue(const std::string& op, double seconds);
  void RecordBatch(const std::string& op, int requests);
  void RecordKernel(const std::string& op, double seconds);
  prometheus::Gauge& QueueDepth(const std::string& op);

  // FusedOp latency breakdown, fusedserve_fused_op_stage_seconds{stage}: one
  // observation per request (receive, decode, queue, encode, send) or per
  // launch (h2d, kernel, d2h). Series made once: no lookup on the hot path.
  enum class Stage { kReceive, kDecode, kQueue, kH2D, kKernel, kD2H, kEncode, kSend };
  static constexpr int kStages = 8;
  void RecordStage(Stage stage, double seconds);
  // FusedOp launches run on the gRPC thread that received the request.
  prometheus::Counter& inline_launches() { return *inline_launches_; }

  // While one is alive on a thread, the Record* calls above made on that
  // thread are held and made when the outermost one ends (the series are
  // looked up at once; only the updates wait). A FusedOp call opens one
  // around its handling, so that its dozen histogram updates, whose cache
  // lines are cold at c=1, happen after gRPC has written the answer instead
  // of before (fused_op_host_bench: ~1.2-2 us of misses on the 2-core
  // machine). Beyond kMaxDeferred held updates the rest are made at once.
  class DeferScope {
   public:
    DeferScope();
    ~DeferScope();
    DeferScope(const DeferScope&) = delete;
    DeferScope& operator=(const DeferScope&) = delete;

   private:
    const bool outermost_;
  };
  static constexpr int kMaxDeferred = 32;

  prometheus::Registry& registry() { return *registry_; }
  prometheus::Gauge& ready() { return *ready_; }
  prometheus::Gauge& queued_bytes() { return *queued_bytes_; }
  prometheus::Gauge& warmup_seconds() { return *warmup_seconds_; }
  prometheus::Counter& tuning_cache_hits() { return *tuning_hits_; }
  prometheus::Counter& tuning_cache_misses() { return *tuning_misses_; }
  prometheus::Counter& tuning_benchmarks() { return *tuning_benchmarks_; }
  prometheus::Counter& tuning_cache_rejected(const std::string& reason) {
    return tuning_rejected_->Add({{"reason", reason}});
  }
  prometheus::Gauge& gpu_memory_used_bytes() { return *gpu_memory_; }

  // Generation metrics.
  prometheus::Histogram& time_to_first_token() { return *ttft_; }
  prometheus::Histogram& time_per_output_token() { return *tpot_; }
  // Tokenizer time of one Generate request: op "encode" (the prompt) or
  // "decode" (the stream's incremental detokenization and stop matching).
  prometheus::Histogram& tokenizer_time(const std::string& op) { return op == "encode" ? *tok_encode_ : *tok_decode_; }
  // From a token being sampled to the stream message carrying it being sent.
  prometheus::Histogram& token_send() { return *token_send_; }
  // The engine's steps: the forward pass, and the time between two
  // consecutive forward passes (scheduling, sampling, streaming: the GPU
  // waits for the host then).
  prometheus::Histogram& engine_forward() { return *engine_forward_; }
  prometheus::Histogram& engine_between_forwards() { return *engine_between_; }
  prometheus::Counter& prompt_tokens() { return *prompt_tokens_; }
  prometheus::Counter& generated_tokens() { return *generated_tokens_; }
  prometheus::Gauge& requests_running() { return *running_; }
  prometheus::Gauge& requests_waiting() { return *waiting_; }
  prometheus::Gauge& kv_cache_blocks_used() { return *kv_used_; }
  prometheus::Gauge& kv_cache_blocks_total() { return *kv_total_; }
  prometheus::Gauge& kv_cache_blocks_cached() { return *kv_cached_; }
  prometheus::Gauge& kv_cache_blocks_shared() { return *kv_shared_; }
  prometheus::Counter& prefix_cache_hit_tokens() { return *prefix_hit_tokens_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  // Tells this instance's series apart in the per-thread series cache
  // (metrics.cc CachedSeries): never reused, unlike an address.
  const uint64_t id_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Histogram>* request_duration_;
  prometheus::Family<prometheus::Histogram>* queue_duration_;
  prometheus::Family<prometheus::Histogram>* batch_size_;
  prometheus::Family<prometheus::Gauge>* queue_depth_;
  prometheus::Family<prometheus::Histogram>* kernel_duration_;
  prometheus::Family<prometheus::Counter>* tuning_rejected_;
  prometheus::Gauge* ready_;
  prometheus::Gauge* queued_bytes_;
  prometheus::Gauge* warmup_seconds_;
  prometheus::Counter* tuning_hits_;
  prometheus::Counter* tuning_misses_;
  prometheus::Counter* tuning_benchmarks_;
  prometheus::Gauge* gpu_memory_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* tpot_;
  prometheus::Histogram* tok_encode_;
  prometheus::Histogram* tok_decode_;
  prometheus::Histogram* token_send_;
  prometheus::Histogram* engine_forward_;
  prometheus::Histogram* engine_between_;
  prometheus::Histogram* stages_[kStages];
  prometheus::Counter* inline_launches_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generated_tokens_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* kv_total_;
  prometheus::Gauge* kv_cached_;
  prometheus::Gauge* kv_shared_;
  prometheus::Counter* prefix_hit_tokens_;
};

}  // namespace fusedserve
