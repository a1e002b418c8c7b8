// fusedserve: the server binary.
//   fusedserve [serve] --listen=0.0.0.0:50051 --metrics_listen=0.0.0.0:9090 ...
//   fusedserve tune ...   fills the tuning cache for the envelope and exits
// Start-up: pick the backend, start gRPC (health NOT_SERVING) and /metrics,
// warm up, then report SERVING. SIGTERM/SIGINT during start-up: exit at once
// (128 + signal). Once serving: NOT_SERVING, new calls get UNAVAILABLE,
// running ones finish within --shutdown_grace_seconds (then get
// UNAVAILABLE), exit 0. See server/lifecycle.h and docs/reliability.md.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "model/kernel_shapes.h"
#include "model/tensor_parallel.h"
#include "server/batcher.h"
#include "server/lifecycle.h"
#include "server/model_rpc.h"
#include "server/scheduler.h"
#include "server/service.h"
#include "server/tls.h"
#include "telemetry/log.h"
#include "telemetry/metrics.h"
#include "warmup/warmup.h"
#ifdef FUSEDSERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "model/cuda_runner.h"
#endif

// civetweb (prometheus-cpp's HTTP exposer) starts its threads with 100 KiB
// stacks; libcublasLt's ~92 KiB of static TLS is carved out of every stack,
// so those threads fail to start. Enforce a 1 MiB floor for every thread.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinStack = size_t{1} << 20;
  return real(attr, size < kMinStack ? kMinStack : size);
}

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC listen address HOST:PORT");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9090", "Prometheus /metrics address HOST:PORT; empty disables");
ABSL_FLAG(int, metrics_threads, 16,
          "/metrics worker threads: connections served at once (an idle connection holds one until it times out)");
ABSL_FLAG(int, metrics_request_timeout_ms, 5000,
          "/metrics: time a connection gets to send its request and receive the answer before it is closed, ms");
ABSL_FLAG(std::string, device, "auto", "auto (CUDA when a GPU is present, else CPU), cuda or cpu");
ABSL_FLAG(int, cuda_device, 0, "CUDA device ordinal");
ABSL_FLAG(int, cuda_small_op_lanes, 16,
          "CUDA streams for small memory-bound FusedOps (norms, softmax, activations, rope; zero-copy, up to 1 MiB): "
          "that many run side by side, inline on the gRPC threads that received them; GEMMs, attention and larger "
          "ops run one at a time (1..64; 1 = every launch on one stream, small ones inline only while the batcher "
          "is idle)");
ABSL_FLAG(std::string, tuning_cache, "/var/cache/fusedserve/tuning_cache.json",
          "Tuning cache file (shared by replicas); empty keeps tuned configs in memory only");
ABSL_FLAG(std::string, envelope, "",
          "JSON file listing the (op, dtype, shape) entries to warm up; default: the model's");
ABSL_FLAG(double, tune_budget_seconds, 600, "Time budget for tuning missing cache entries at start-up");
ABSL_FLAG(bool, tune_at_startup, true, "Tune envelope entries missing from the cache before SERVING");
ABSL_FLAG(std::string, model, "", "Hugging Face checkpoint directory (config.json + *.safetensors)");
ABSL_FLAG(std::string, model_preset, "tiny", "Built-in model config used when --model is empty");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the random weights of a built-in model");
ABSL_FLAG(double, shutdown_grace_seconds, 30, "On SIGTERM, time given to in-flight requests before cancelling");
ABSL_FLAG(int, max_message_bytes, 512 << 20, "Largest gRPC message accepted or sent, bytes");
ABSL_FLAG(int64_t, max_tensor_elements, int64_t{1} << 28, "Largest tensor accepted, elements");
ABSL_FLAG(int64_t, max_op_bytes, int64_t{4} << 30,
          "Largest outputs + working memory one FusedOp may need, bytes (estimated from shapes before it runs); "
          "larger requests get RESOURCE_EXHAUSTED");
ABSL_FLAG(double, max_op_flops, 0,
          "Most work one FusedOp may ask for, FLOPs (estimated from shapes before it runs); larger requests get "
          "RESOURCE_EXHAUSTED. 0 = 2e14 on CUDA (well under a second), 5e10 on the CPU reference");
ABSL_FLAG(int64_t, max_queued_bytes, int64_t{1} << 30,
          "Input bytes that queued FusedOp requests (and, separately, queued TransformerBlock calls) may hold "
          "together before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, worker_threads, 0, "Threads running FusedOp requests; 0 = CPU cores (CPU) or 2 (CUDA)");
ABSL_FLAG(int, max_queue, 1024, "FusedOp requests queued before RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, inline_max_bytes, 256 << 10,
          "Row-wise FusedOps (norms, softmax, activations, rope) with at most this many input bytes run on the gRPC "
          "thread that received them when the scheduler is idle (nothing queued or running): no hand-off to a "
          "worker and back (c=1 latency). Under load requests still queue and batch. 0 disables");
ABSL_FLAG(std::string, fused_op_api, "async",
          "gRPC API serving FusedOp: async (completion queues, one dedicated polling thread each; the thread that "
          "receives a call runs small ops inline and answers; every other RPC, health included, is served on the "
          "same queues), callback (gRPC's callback threads) or sync (gRPC's sync thread pool); with callback or "
          "sync the other RPCs use the callback API. See bench/run_grpc_floor.sh");
ABSL_FLAG(int, grpc_pollers, 0,
          "--fused_op_api=sync: most threads polling for new calls at once (threads running calls are extra, up "
          "to --grpc_max_threads); async: polling threads (see --grpc_cqs). 0 = CPU cores, at most 16");
ABSL_FLAG(int, grpc_cqs, 0,
          "--fused_op_api=async: completion queues the polling threads share (round robin); 0 = one per thread. "
          "Fewer queues than threads: the thread that reads a call from a socket more often serves it itself");
ABSL_FLAG(std::string, grpc_poll_strategy, "poll",
          "gRPC's I/O polling engine (the GRPC_POLL_STRATEGY environment variable wins when set): poll (each "
          "completion queue's thread polls the connections it accepted, so the thread that reads a call serves it: "
          "no hand-off between threads per call; see bench/run_grpc_floor.sh) or epoll1 (gRPC's default: one epoll "
          "set any polling thread reads; for many thousands of connections); empty: gRPC's default");
ABSL_FLAG(int, grpc_poll_spin_us, 100,
          "--fused_op_api=async: after each event a polling thread keeps polling its queue without blocking for "
          "this long, yielding the core between polls, so that a steady client's next request does not find it "
          "asleep (on a VM, a halted vCPU's wake-up costs tens of microseconds); idle queues block. 0: block at "
          "once. See bench/run_grpc_floor.sh");
ABSL_FLAG(int, grpc_poll_spinners, 4,
          "--fused_op_api=async: at most this many polling threads spin (--grpc_poll_spin_us) at once; the others "
          "block after each event, so that under load the pollers do not keep every core busy. 0: no bound");
ABSL_FLAG(bool, fused_op_answer_on_poller, true,
          "--fused_op_api=async: a FusedOp run by a scheduler worker (queued, or merged into a batch) is answered "
          "(encoded and written) on its call's own polling thread, handed over through the queue, so the answers of "
          "a merged launch go out in parallel; false: the worker answers each in turn");
ABSL_FLAG(bool, fused_op_wire_codec, true,
          "Decode FusedOp requests straight from gRPC's slices and encode responses straight from the outputs "
          "(one copy of each tensor's bytes each way); false: through protobuf messages");
ABSL_FLAG(int, grpc_max_threads, 1024,
          "--fused_op_api=sync: threads serving calls at most (a gRPC resource quota); calls beyond wait in gRPC's "
          "queue");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain for the gRPC port; with --tls_key enables TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate signed by it (mutual TLS)");
// Generation engine (TransformerBlock, Generate); see engine/engine.h.
ABSL_FLAG(int64_t, kv_cache_blocks, 0, "KV cache blocks; 0 = as many as --kv_cache_bytes holds");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{64} << 20, "KV cache memory when --kv_cache_blocks=0, bytes");
ABSL_FLAG(double, kv_cache_gpu_fraction, 0.85,
          "CUDA model runner with --kv_cache_blocks=0: share of free GPU memory (after weights and step "
          "buffers) given to the KV cache");
ABSL_FLAG(int64_t, kv_block_size, 16, "Positions per KV cache block");
ABSL_FLAG(int, max_running, 64, "Sequences decoded together at most");
ABSL_FLAG(int, max_waiting, 256, "Generate requests queued before RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_batched_tokens, 8192, "Tokens (prefill + decode) per engine step at most");
ABSL_FLAG(bool, prefix_caching, true,
          "Generate: keep full KV-cache blocks after a sequence ends and share them with later prompts that start "
          "with the same tokens (their prefill is skipped)");
ABSL_FLAG(int64_t, prefill_chunk_tokens, 2048,
          "Chunked prefill: prompt tokens one sequence prefills per engine step at most (0 = whole prompts)");
ABSL_FLAG(int, max_new_tokens_limit, 4096, "Cap on a Generate request's max_new_tokens");
ABSL_FLAG(int64_t, max_block_tokens, 8192,
          "Tokens (B x S) of one TransformerBlock call at most; more get INVALID_ARGUMENT. Calls run in chunks "
          "of --prefill_chunk_tokens rows between decode steps");
ABSL_FLAG(int64_t, max_seq_len, 0, "Longest sequence (prompt + generated); 0 = the model's, capped at 8192");
ABSL_FLAG(int, model_threads, 0, "Threads of the CPU model runner's GEMMs; 0 = CPU cores");
ABSL_FLAG(int, generate_writer_threads, 2,
          "Threads that serialize and write Generate stream messages, so the engine thread (which the GPU waits on "
          "between steps) only hands tokens over; 0 = the engine thread writes them");
ABSL_FLAG(int, tensor_parallel, 1,
          "GPUs the model is split over (Megatron tensor parallelism over NCCL): --cuda_device and the next N-1. "
          "On the CPU backend the model is held and run as N shards in turn (a check of the sharding, not faster)");
ABSL_FLAG(bool, batching, true,
          "Merge compatible FusedOp requests into one launch (dynamic batcher); false runs each request alone");
ABSL_FLAG(int64_t, batch_max_rows, 2048, "Batcher: rows (tokens) per merged launch");
ABSL_FLAG(int64_t, batch_max_delay_us, 200, "Batcher: longest wait of a queued request for company, µs");
ABSL_FLAG(int64_t, batch_idle_us, 0,
          "Batcher: launch once no compatible request arrived for this long, µs (0 disables)");
ABSL_FLAG(int, batch_parallel_launches, 0,
          "Batcher: launches the backend runs at once; while fewer run, queued requests go at once "
          "(0 = 1 for CUDA, --worker_threads for CPU)");
ABSL_FLAG(std::string, batch_preferred_rows, "",
          "Batcher: comma-separated row counts launched without waiting (largest reached caps the batch)");
ABSL_FLAG(std::string, batch_overrides, "",
          "Batcher: per-op settings, e.g. rms_norm:max_rows=8192:delay_us=100,linear:preferred=64/128:max_queue=256 "
          "(keys: max_rows, delay_us, idle_us, max_queue, preferred)");

namespace fusedserve {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device, ConfigLookup lookup) {
  if (device != "auto" && device != "cuda" && device != "cpu") {
    return absl::InvalidArgumentError("--device must be auto, cuda or cpu (got '" + device + "')");
  }
#ifdef FUSEDSERVE_HAVE_CUDA
  if (device == "cuda" || (device == "auto" && CudaDeviceCount() > 0)) {
    return MakeCudaBackend(absl::GetFlag(FLAGS_cuda_device), std::move(lookup),
                           absl::GetFlag(FLAGS_cuda_small_op_lanes));
  }
  if (device == "auto") LogWarning("no CUDA device found; using the CPU reference backend (slow)");
#else
  if (device == "cuda") return absl::FailedPreconditionError("this build has no CUDA backend (built without nvcc)");
  if (device == "auto") LogWarning("built without CUDA; using the CPU reference backend (slow)");
#endif
  return MakeCpuBackend();
}

// The hosted model's config as far as the envelope needs it (no weights
// read); failures are left to the model loading that follows, which reports them.
std::optional<ModelConfig> HostedModelConfig() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    absl::StatusOr<ModelConfig> c = PresetConfig(absl::GetFlag(FLAGS_model_preset));
    return c.ok() ? std::optional<ModelConfig>(*c) : std::nullopt;
  }
  // Through ConfigFromHfFile: a FIFO or device at the path is refused, not blocked on.
  absl::StatusOr<ModelConfig> c = ConfigFromHfFile(dir + "/config.json");
  return c.ok() ? std::optional<ModelConfig>(*c) : std::nullopt;
}

// The envelope of the hosted model: its own kernels at the engine's step
// sizes and the FusedOp defaults at its dims, in its dtype.
WarmupOptions WarmupOptionsFromFlags() {
  WarmupOptions o;
  if (std::optional<ModelConfig> m = HostedModelConfig()) {
    o.dtype = m->dtype;
    // Split over GPUs, a rank's kernels see its shard's shapes.
    const int tp = absl::GetFlag(FLAGS_tensor_parallel);
    absl::StatusOr<TensorShard> shard = ShardOf(*m, 0, tp);
    const ModelConfig per_rank = shard.ok() ? ShardConfig(*m, *shard) : *m;
    o.model_entries =
        ModelEnvelope(per_rank, absl::GetFlag(FLAGS_max_batched_tokens), absl::GetFlag(FLAGS_max_running));
    o.model_shapes.push_back({m->hidden, m->intermediate, m->q_heads, m->kv_heads, m->head_dim, m->vocab});
  }
  o.cache_path = absl::GetFlag(FLAGS_tuning_cache);
  o.envelope_path = absl::GetFlag(FLAGS_envelope);
  o.tune_budget_seconds = absl::GetFlag(FLAGS_tune_budget_seconds);
  o.tune_missing = absl::GetFlag(FLAGS_tune_at_startup);
  return o;
}

// The FusedOp scheduler: the dynamic batcher (--batching) or the direct FIFO.
absl::StatusOr<std::unique_ptr<OpScheduler>> MakeScheduler(Backend* backend, Metrics* metrics,
                                                           const DirectSchedulerOptions& direct,
                                                           const ValidationLimits& limits) {
  if (!absl::GetFlag(FLAGS_batching)) return MakeDirectScheduler(backend, metrics, direct);
  BatcherOptions o;
  o.threads = direct.threads;
  o.max_queue = direct.max_queue;
  o.max_queued_bytes = direct.max_queued_bytes;
  o.max_launch_bytes = limits.max_op_bytes;
  o.max_launch_flops = limits.max_op_flops;
  o.inline_max_bytes = direct.inline_max_bytes;
  o.parallel_launches = absl::GetFlag(FLAGS_batch_parallel_launches);
  if (o.parallel_launches <= 0) o.parallel_launches = backend->name() == "cuda" ? 1 : direct.threads;
  // More than one lane: small inline launches have lanes of their own.
  const int lanes = absl::GetFlag(FLAGS_cuda_small_op_lanes);
  if (backend->name() == "cuda" && lanes > 1) o.inline_launches = lanes;
  o.defaults.max_rows = absl::GetFlag(FLAGS_batch_max_rows);
  o.defaults.max_delay_us = absl::GetFlag(FLAGS_batch_max_delay_us);
  o.defaults.idle_us = absl::GetFlag(FLAGS_batch_idle_us);
  absl::StatusOr<std::vector<int64_t>> preferred = ParseRowList(absl::GetFlag(FLAGS_batch_preferred_rows));
  if (!preferred.ok()) {
    return absl::InvalidArgumentError("--batch_preferred_rows: " + std::string(preferred.status().message()));
  }
  o.defaults.preferred_rows = *preferred;
  absl::StatusOr<std::map<std::string, BatchPolicy>> per_op =
      ParseBatchOverrides(absl::GetFlag(FLAGS_batch_overrides), o.defaults);
  if (!per_op.ok()) return per_op.status();
  o.per_op = *std::move(per_op);
  return MakeBatcher(backend, metrics, o);
}

// Per-request bounds of FusedOp (validation.h); the work bound depends on
// the backend: the CPU reference is ~1000x slower than a GPU.
ValidationLimits LimitsFromFlags(const Backend& backend) {
  ValidationLimits l;
  l.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  l.max_op_bytes = static_cast<double>(absl::GetFlag(FLAGS_max_op_bytes));
  l.max_op_flops = absl::GetFlag(FLAGS_max_op_flops);
  if (l.max_op_flops <= 0) l.max_op_flops = backend.name() == "cuda" ? 2e14 : 5e10;
  l.max_output_bytes = static_cast<double>(absl::GetFlag(FLAGS_max_message_bytes));
  return l;
}

v1::GetServerInfoResponse MakeServerInfo(const Backend& backend, const WarmupReport& report,
                                         const std::string& cache_path) {
  v1::GetServerInfoResponse info;
  info.set_version(FUSEDSERVE_VERSION);
  info.set_device(backend.name());
  info.set_device_name(backend.device_name());
  for (const OpSpec& spec : AllOpSpecs()) {
    v1::OpInfo* op = info.add_ops();
    op->set_name(spec.name);
    for (const std::string& in : spec.inputs) op->add_inputs(in);
    for (const std::string& out : spec.outputs) op->add_outputs(out);
    for (v1::DType d : {v1::F32, v1::F16, v1::BF16}) op->add_dtypes(d);
  }
  v1::TuningCacheInfo* cache = info.mutable_tuning_cache();
  cache->set_path(cache_path);
  cache->set_state(report.cache_state);
  cache->set_entries(report.entries);
  cache->set_hits(report.hits);
  cache->set_misses(report.misses);
  return info;
}

void ExportWarmupReport(const WarmupReport& report, Metrics& metrics) {
  metrics.warmup_seconds().Set(report.seconds);
  metrics.tuning_cache_hits().Increment(static_cast<double>(report.hits));
  metrics.tuning_cache_misses().Increment(static_cast<double>(report.misses));
  metrics.tuning_benchmarks().Increment(static_cast<double>(report.benchmarks));
  for (const auto& [reason, count] : report.rejected) {
    metrics.tuning_cache_rejected(reason).Increment(static_cast<double>(count));
  }
}

// The drain after SIGTERM: NOT_SERVING at once; calls arriving from now on
// get UNAVAILABLE from the handlers (retriable) while the gRPC port stays
// open; running calls get until the grace ends, then UNAVAILABLE (FusedOps
// stop at their next check, generations are ended by the engine); then the
// port closes.
void Drain(grpc::Server& server, FusedServeService& service, Engine& engine, Metrics& metrics) {
  const double grace = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  const absl::Time grace_end = absl::Now() + absl::Seconds(grace);
  LogInfo(absl::StrCat("draining (grace ", grace, " s)"));
  server.GetHealthCheckService()->SetServingStatus(false);
  metrics.ready().Set(0);
  service.StartDrain();
  absl::Notification drained;
  std::thread grace_timer([&] {
    if (drained.WaitForNotificationWithDeadline(grace_end)) return;
    LogWarning("drain grace ended with calls still running; ending them with UNAVAILABLE");
    service.AbortInFlight();
    engine.Shutdown();
  });
  // Until every call is done (or the timer has ended them), the port stays
  // open, so late arrivals get the handlers' UNAVAILABLE, not a reset.
  service.WaitIdle(grace_end + absl::Seconds(1) - absl::Now());
  // Whatever is still left is cancelled by gRPC.
  server.Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
  drained.Notify();
  grace_timer.join();
}

// fusedserve tune: fills the tuning cache on the GPU, then exits.
int Tune(TuningService& tuning, Backend& backend) {
  if (backend.name() != "cuda") {
    LogError(
        "fusedserve tune needs a CUDA GPU: kernel configs are tuned by timing them on the device, and "
        "this host has none (--device=" +
        absl::GetFlag(FLAGS_device) + "); run it on the GPU node");
    return 2;
  }
  if (absl::Status s = tuning.Warmup(&backend, [](const std::string& line) { LogInfo(line); }); !s.ok()) {
    LogError("tuning failed: " + std::string(s.message()));
    return 1;
  }
  const WarmupReport r = tuning.report();
  LogInfo(absl::StrCat("tuning cache ", r.cache_state, ": ", r.entries, " entries, ", r.misses, " tuned, ",
                       r.benchmarks, " configs timed in ", r.seconds, " s"));
  return 0;
}

absl::Status ServeMetrics(Metrics& metrics) {
  const std::string listen = absl::GetFlag(FLAGS_metrics_listen);
  if (listen.empty()) return absl::OkStatus();
  MetricsServeOptions o;
  o.listen = listen;
  o.threads = absl::GetFlag(FLAGS_metrics_threads);
  o.request_timeout_ms = absl::GetFlag(FLAGS_metrics_request_timeout_ms);
  o.grpc_uses_tls = !absl::GetFlag(FLAGS_tls_cert).empty();
  if (absl::Status s = metrics.Serve(o); !s.ok()) return s;
  LogInfo("metrics on http://" + listen + "/metrics");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OpScheduler>> MakeOpScheduler(Backend& backend, Metrics& metrics,
                                                             const ValidationLimits& limits) {
  DirectSchedulerOptions o;
  o.threads = absl::GetFlag(FLAGS_worker_threads);
  if (o.threads <= 0) o.threads = backend.name() == "cuda" ? 2 : static_cast<int>(std::thread::hardware_concurrency());
  o.max_queue = absl::GetFlag(FLAGS_max_queue);
  o.max_queued_bytes = absl::GetFlag(FLAGS_max_queued_bytes);
  o.inline_max_bytes = absl::GetFlag(FLAGS_inline_max_bytes);
  return MakeScheduler(&backend, &metrics, o, limits);
}

// The hosted model: its weights (random for --model_preset unless --model is
// set) on the backend's runner, and the KV cache size for it.
struct HostedModel {
  ModelConfig config;
  std::unique_ptr<ModelRunner> runner;
  int64_t kv_cache_blocks = 0;
};

absl::StatusOr<HostedModel> LoadHostedModel(Backend& backend, TuningService& tuning) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      LoadModelWeights(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_model_preset), absl::GetFlag(FLAGS_seed));
  if (!weights.ok()) return weights.status();
  HostedModel m;
  m.config = (*weights)->config();
  LogInfo(absl::StrCat("model ", m.config.name, ": ", m.config.layers, " layers, hidden ", m.config.hidden, ", vocab ",
                       m.config.vocab, ", ", m.config.NumParameters() / 1e6, "M parameters"));
  m.kv_cache_blocks = absl::GetFlag(FLAGS_kv_cache_blocks);
  absl::StatusOr<std::unique_ptr<ModelRunner>> runner = absl::UnimplementedError("no model runner");
#ifdef FUSEDSERVE_HAVE_CUDA
  if (backend.name() == "cuda") {
    CudaModelRunnerOptions o;
    o.device = absl::GetFlag(FLAGS_cuda_device);
    o.max_tokens = absl::GetFlag(FLAGS_max_batched_tokens);
    o.max_seqs = absl::GetFlag(FLAGS_max_running);
    o.tuned = tuning.counted_lookup();
    o.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
    runner = MakeCudaModelRunner(*std::move(weights), o);
    if (!runner.ok()) return runner.status();
    if (o.tensor_parallel > 1)
      LogInfo(absl::StrCat("tensor parallel: the model is split over GPUs ", o.device, "..",
                           o.device + o.tensor_parallel - 1, " (NCCL)"));
    if (m.kv_cache_blocks <= 0) {
      absl::StatusOr<int64_t> blocks =
          CudaKvCacheBlocks(**runner, o.device, absl::GetFlag(FLAGS_kv_block_size),
                            absl::GetFlag(FLAGS_kv_cache_gpu_fraction), /*reserve_bytes=*/int64_t{512} << 20);
      if (!blocks.ok()) return blocks.status();
      m.kv_cache_blocks = *blocks;
    }
  }
#endif
  if (backend.name() != "cuda")
    runner = MakeCpuModelRunner(*std::move(weights), absl::GetFlag(FLAGS_model_threads),
                                absl::GetFlag(FLAGS_tensor_parallel));
  if (!runner.ok()) return runner.status();
  m.runner = *std::move(runner);
  return m;
}

// The tokenizer: the checkpoint's tokenizer.json, or the presets' built-in
// one. One the server cannot reproduce exactly is a config error.
absl::StatusOr<std::unique_ptr<TextSupport>> LoadText(const ModelConfig& model) {
  absl::StatusOr<std::unique_ptr<TextSupport>> text =
      TextSupport::Load(absl::GetFlag(FLAGS_model), static_cast<int32_t>(model.vocab));
  if (!text.ok()) return text.status();
  if (const tokenizer::Tokenizer* t = (*text)->tokenizer(); t != nullptr) {
    LogInfo(absl::StrCat("tokenizer: ", t->name(), ", vocab ", t->vocab_size()));
  } else {
    v1::TokenizerInfo why;
    (*text)->FillInfo(&why);
    LogWarning("tokenizer: " + why.unavailable_reason());
  }
  return text;
}

absl::StatusOr<ServiceOptions> ServiceOptionsFromFlags(const ValidationLimits& limits) {
  ServiceOptions o;
  o.limits = limits;
  const std::string api = absl::GetFlag(FLAGS_fused_op_api);
  if (api != "callback" && api != "sync" && api != "async") {
    return absl::InvalidArgumentError("--fused_op_api must be callback, sync or async (got '" + api + "')");
  }
  o.answer_on_poller = absl::GetFlag(FLAGS_fused_op_answer_on_poller);
  o.poll_spin = absl::Microseconds(std::max(0, absl::GetFlag(FLAGS_grpc_poll_spin_us)));
  o.poll_spinners = std::max(0, absl::GetFlag(FLAGS_grpc_poll_spinners));
  o.wire_codec = absl::GetFlag(FLAGS_fused_op_wire_codec);
  o.fused_op_api = api == "sync"    ? ServiceOptions::FusedOpApi::kSync
                   : api == "async" ? ServiceOptions::FusedOpApi::kAsync
                                    : ServiceOptions::FusedOpApi::kCallback;
  return o;
}

// The gRPC server and what must outlive it.
struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  grpc::CallbackGenericService unknown_methods;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> fused_op_cqs;
  AsyncHealth* health = nullptr;  // --fused_op_api=async (owned by the server)
  int async_threads = 0;          // --fused_op_api=async: polling threads over fused_op_cqs
};

// Listens on --listen with FusedOp on the --fused_op_api server model.
absl::Status StartGrpc(FusedServeService& service, GrpcServer* g) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  int bound_port = 0;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(
      {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_client_ca)});
  if (!credentials.ok()) return credentials.status();
  // No SO_REUSEPORT: a second server on a busy port fails to start instead
  // of silently sharing its connections with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(listen, *credentials, &bound_port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.SetMaxSendMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  const std::string api = absl::GetFlag(FLAGS_fused_op_api);
  if (api == "async") {
    // Every method, health included, on the completion queues
    // (server/async_calls.h): no callback-API method, so no threads but the
    // queues' poll gRPC's sockets. Unknown methods get UNIMPLEMENTED from
    // gRPC itself.
    auto health = std::make_unique<AsyncHealth>();
    g->health = health.get();
    builder.RegisterService(g->health->service());
    builder.SetOption(std::make_unique<grpc::HealthCheckServiceServerBuilderOption>(std::move(health)));
    builder.RegisterService(service.fused_op_service());
  } else {
    builder.RegisterService(&service);
  }
  if (api == "sync") {
    // FusedOp on the sync API: the pool thread that receives a call serves it.
    builder.RegisterService(service.fused_op_service());
    // FusedOp is "generic" in `service` (so that it is registered once); gRPC
    // then wants a generic service, which answers every unknown method with
    // UNIMPLEMENTED, as gRPC itself would.
    builder.RegisterCallbackGenericService(&g->unknown_methods);
  }
  int pollers = absl::GetFlag(FLAGS_grpc_pollers);
  if (pollers <= 0) pollers = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  if (api == "sync") {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, pollers);
    grpc::ResourceQuota quota("fusedserve");
    quota.SetMaxThreads(std::max(2, absl::GetFlag(FLAGS_grpc_max_threads)));
    builder.SetResourceQuota(quota);
  } else if (api == "async") {
    int cqs = absl::GetFlag(FLAGS_grpc_cqs);
    cqs = cqs <= 0 ? pollers : std::min(cqs, pollers);
    for (int i = 0; i < cqs; ++i) g->fused_op_cqs.push_back(builder.AddCompletionQueue());
    g->async_threads = pollers;
  }
  g->server = builder.BuildAndStart();
  if (g->server == nullptr || bound_port == 0) return absl::UnavailableError("cannot listen on " + listen);
  // gRPC's default health service starts out SERVING: say NOT_SERVING before
  // anything else, so a probe cannot catch the server before its warm-up.
  g->server->GetHealthCheckService()->SetServingStatus(false);
  if (!g->fused_op_cqs.empty()) {
    std::vector<grpc::ServerCompletionQueue*> cqs;
    for (auto& cq : g->fused_op_cqs) cqs.push_back(cq.get());
    service.StartAsync(cqs, g->async_threads, g->health);
  }
  const char* poll = std::getenv("GRPC_POLL_STRATEGY");
  LogInfo(absl::StrCat("listening on ", listen, " (port ", bound_port, ", gRPC poll engine ",
                       poll != nullptr ? poll : "default", "); warming up"));
  return absl::OkStatus();
}

EngineOptions EngineOptionsFromFlags(int64_t kv_cache_blocks) {
  EngineOptions o;
  o.kv_cache_blocks = kv_cache_blocks;
  o.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  o.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  o.max_running = absl::GetFlag(FLAGS_max_running);
  o.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  o.max_batched_tokens = absl::GetFlag(FLAGS_max_batched_tokens);
  o.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);
  o.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  o.max_new_tokens_limit = absl::GetFlag(FLAGS_max_new_tokens_limit);
  o.max_block_tokens = absl::GetFlag(FLAGS_max_block_tokens);
  o.max_queued_block_bytes = absl::GetFlag(FLAGS_max_queued_bytes);
  o.max_seq_len = absl::GetFlag(FLAGS_max_seq_len);
  return o;
}

// What the CUDA model runner's kernels run: tuned configs found, and which
// decode graphs kept them.
void LogModelKernels(TuningService& tuning, const Engine& engine) {
  const LookupCounts counts = tuning.counts();
  std::string line = absl::StrCat("model kernels: ", counts.hits, " of ", counts.keys,
                                  " shape buckets run tuned configs from the tuning cache");
  if (!counts.missed.empty()) {
    absl::StrAppend(&line, "; defaults for ", counts.missed.size(), " (first: ", counts.missed[0], ")");
  }
  LogInfo(line);
#ifdef FUSEDSERVE_HAVE_CUDA
  if (const std::string graphs = CudaDecodeGraphReport(engine.runner()); !graphs.empty()) {
    LogInfo("decode graphs, tuned vs built-in configs timed in context: " + graphs);
  }
#endif
}

// Start-up in order (each step's failure exits 1 with its reason), serving,
// then the drain on SIGTERM.
int Run(const std::string& mode, Lifecycle& lifecycle) {
  auto fail = [](const std::string& what, const absl::Status& s) {
    LogError(what + std::string(s.message()));
    return 1;
  };
  // 1. Tuning cache and backend ("fusedserve tune" stops after tuning).
  absl::StatusOr<std::unique_ptr<TuningService>> tuning = TuningService::Create(WarmupOptionsFromFlags());
  if (!tuning.ok()) return fail("tuning cache: ", tuning.status());
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(absl::GetFlag(FLAGS_device), (*tuning)->lookup());
  if (!backend.ok()) return fail("", backend.status());
  LogInfo("backend: " + (*backend)->name() + " (" + (*backend)->device_name() + ")");
  if (mode == "tune") return Tune(**tuning, **backend);

  // 2. Metrics (never destroyed: the process leaves through _Exit once
  // drained, and civetweb's stop alone would take ~2 s) and the op scheduler.
  Metrics& metrics = *new Metrics;
  if (absl::Status s = ServeMetrics(metrics); !s.ok()) return fail("", s);
  const ValidationLimits limits = LimitsFromFlags(**backend);
  absl::StatusOr<std::unique_ptr<OpScheduler>> scheduler = MakeOpScheduler(**backend, metrics, limits);
  if (!scheduler.ok()) return fail("", scheduler.status());

  // 3. The hosted model and its tokenizer.
  SetGenerateWriterThreads(absl::GetFlag(FLAGS_generate_writer_threads));
  absl::StatusOr<HostedModel> model = LoadHostedModel(**backend, **tuning);
  if (!model.ok()) return fail("model: ", model.status());
  absl::StatusOr<std::unique_ptr<TextSupport>> text = LoadText(model->config);
  if (!text.ok()) return fail("tokenizer: ", text.status());

  // 4. Listen (health NOT_SERVING, FusedOp UNAVAILABLE until warm: StartGrpc).
  absl::StatusOr<ServiceOptions> service_options = ServiceOptionsFromFlags(limits);
  if (!service_options.ok()) return fail("", service_options.status());
  FusedServeService service(backend->get(), scheduler->get(), &metrics, *service_options);
  GrpcServer grpc_server;
  if (absl::Status s = StartGrpc(service, &grpc_server); !s.ok()) return fail("", s);
  grpc::HealthCheckServiceInterface* health = grpc_server.server->GetHealthCheckService();

  // 5. Warm-up (without a warm backend the server must not report SERVING),
  // then the engine: creating its KV cache makes the CUDA runner read its
  // kernels' tuned configs and capture its decode graphs.
  if (absl::Status s = (*tuning)->Warmup(backend->get(), [](const std::string& line) { LogInfo(line); }); !s.ok()) {
    return fail("warm-up failed: ", s);
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::move(model->runner), &metrics, EngineOptionsFromFlags(model->kv_cache_blocks));
  if (!engine.ok()) return fail("engine: ", engine.status());
  service.set_engine(engine->get());
  service.set_text(text->get());
  if ((*backend)->name() == "cuda") LogModelKernels(**tuning, **engine);

  // 6. Serving.
  const WarmupReport report = (*tuning)->report();
  ExportWarmupReport(report, metrics);
  v1::GetServerInfoResponse info = MakeServerInfo(**backend, report, absl::GetFlag(FLAGS_tuning_cache));
  FillModelInfo(model->config, info.mutable_model());
  (*text)->FillInfo(info.mutable_tokenizer());
  service.set_server_info(std::move(info));
  lifecycle.EnterServing([&] {
    service.set_ready(true);
    health->SetServingStatus(true);
    metrics.ready().Set(1);
    LogInfo(absl::StrCat("SERVING (warm-up ", report.seconds, " s)"));
  });

  // 7. SIGTERM: drain, then stop.
  lifecycle.WaitForShutdown();
  Drain(*grpc_server.server, service, **engine, metrics);
  service.StopAsync();
  grpc_server.server->Wait();
  (*engine)->Shutdown();
  (*scheduler)->Shutdown();
  LogInfo("stopped");
  return 0;
}

}  // namespace
}  // namespace fusedserve

int main(int argc, char** argv) {
  // First: a SIGTERM from here on is never lost (see server/lifecycle.h).
  fusedserve::Lifecycle& lifecycle = fusedserve::Lifecycle::Start();
  // Debian's Abseil is built without NDEBUG, which leaves absl::Mutex's
  // deadlock detection on: every lock and unlock (gRPC's own included) then
  // updates a process-wide lock graph under one global lock. A debugging aid
  // that serialises every thread; off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  absl::SetProgramUsageMessage("fusedserve [serve|tune] --flags; see --help");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  std::string mode = args.size() > 1 ? args[1] : "serve";
  if (mode != "serve" && mode != "tune") {
    std::fprintf(stderr, "fusedserve: unknown command '%s' (expected serve or tune)\n", mode.c_str());
    return 2;
  }
  // Read by gRPC at its first use, which comes later. gRPC aborts on an
  // engine it does not know, so the flag takes only the two it has.
  if (const std::string poll = absl::GetFlag(FLAGS_grpc_poll_strategy); !poll.empty()) {
    if (poll != "poll" && poll != "epoll1") {
      std::fprintf(stderr, "fusedserve: --grpc_poll_strategy=%s: expected poll, epoll1 or empty\n", poll.c_str());
      return 2;
    }
    setenv("GRPC_POLL_STRATEGY", poll.c_str(), /*overwrite=*/0);
  }
  // Checked on every backend, so a bad value fails on the CPU fallback too.
  constexpr int kMaxLanes = 64;
#ifdef FUSEDSERVE_HAVE_CUDA
  static_assert(kMaxLanes == fusedserve::kMaxCudaSmallOpLanes, "the CUDA backend's lane limit");
#endif
  if (const int lanes = absl::GetFlag(FLAGS_cuda_small_op_lanes); lanes < 1 || lanes > kMaxLanes) {
    std::fprintf(stderr, "fusedserve: --cuda_small_op_lanes=%d: expected 1..%d\n", lanes, kMaxLanes);
    return 2;
  }
  const int code = fusedserve::Run(mode, lifecycle);
  // Everything is drained by now. Skip static destructors: civetweb's stop
  // alone waits ~2 s on its poll loop, which only delays pod termination.
  std::fflush(nullptr);
  std::_Exit(code);
}
