// The generation engine: one scheduler thread per device that owns the
// ModelRunner and does iteration-level (continuous) batching. Each step:
//   1. drop cancelled / past-deadline sequences (their KV blocks are freed);
//   2. give every running sequence room for its next position (preempting
//      the newest sequence, to be recomputed later, when blocks run out);
//   3. admit waiting requests (FIFO) while limits and free blocks allow;
//      a prompt's longest prefix already in the KV cache (prefix caching,
//      block_allocator.h) is shared, not recomputed; the rest is prefilled
//      in the same forward as the decode tokens, in chunks of at most
//      prefill_chunk_tokens within the step's budget;
//   4. run one forward, sample one token per sequence whose prompt is done,
//      stream it, retire finished sequences.
// TransformerBlock calls run on the same thread, one at a time, a piece per
// step: a chunk of rows through all the call's layers (its K/V in KV cache
// blocks lent to it, so later rows attend to earlier ones), taken from the
// step's token budget like a running prompt's chunk; or, where the runner
// runs blocks only whole, one layer over all rows. So a large call no longer
// stalls the decodes, and its deadline and cancellation stop it between
// pieces. The runner is only ever used by one thread. Sinks are called on the engine
// thread and must not block (the gRPC reactor queues and writes on its own).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/block_allocator.h"
#include "engine/sampler.h"
#include "kernels/clock.h"
#include "model/runner.h"
#include "telemetry/metrics.h"

namespace fusedserve {

struct EngineOptions {
  // KV cache blocks; 0 = as many as kv_cache_bytes holds.
  int64_t kv_cache_blocks = 0;
  // Memory given to the KV cache when kv_cache_blocks is 0 (the CPU runner;
  // for the CUDA runner the server sizes kv_cache_blocks from free GPU
  // memory, --kv_cache_gpu_fraction).
  int64_t kv_cache_bytes = int64_t{64} << 20;
  // Positions per KV block.
  int64_t kv_block_size = 16;
  // Sequences decoded together at most.
  int max_running = 64;
  // Requests queued beyond the running ones; more get RESOURCE_EXHAUSTED.
  int max_waiting = 256;
  // Tokens (prefill + decode) in one forward step at most. Decodes always
  // run; prompts fill what is left.
  int64_t max_batched_tokens = 8192;
  // Chunked prefill: prompt tokens one sequence prefills per step at most,
  // so a long prompt shares steps with the running decodes instead of
  // stalling them. 0: whole prompts (one longer than max_batched_tokens then
  // runs alone).
  int64_t prefill_chunk_tokens = 2048;
  // Cap on a request's max_new_tokens.
  int max_new_tokens_limit = 4096;
  // Tokens (B x S) of one TransformerBlock call at most; more get
  // INVALID_ARGUMENT. Bounds the memory a call holds (its hidden states and,
  // chunked, its K/V) and how long it runs.
  int64_t max_block_tokens = 8192;
  // Bytes (hidden states) that queued TransformerBlock calls may hold
  // together; more get RESOURCE_EXHAUSTED. The server passes --max_queued_bytes.
  int64_t max_queued_block_bytes = int64_t{1} << 30;
  // Prefix caching: full KV blocks stay cached after their sequence ends and
  // are shared by later prompts that start with the same tokens.
  bool prefix_caching = true;
  // Longest sequence (prompt + generated); 0 = the model's
  // max_position_embeddings capped at 8192. Also capped by the cache size.
  int64_t max_seq_len = 0;
};

// kStop: a stop token id, or the sink ended it (a stop string); kEos: one of
// the request's eos_token_ids.
enum class FinishReason { kNone, kLength, kStop, kEos };

struct GenerationResult {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens whose K/V came from the prefix cache
  int64_t generated_tokens = 0;
  double time_to_first_token_s = 0;    // arrival to first token
  double time_per_output_token_s = 0;  // mean over tokens after the first
  FinishReason finish_reason = FinishReason::kNone;
};

// The consumer of one generation (the gRPC stream). Called on the engine thread.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  // Polled at every step boundary; true stops the sequence (CANCELLED).
  virtual bool IsCancelled() = 0;
  // One generated token, with its log-probabilities when the request asked
  // (else null). Must not block. Returning false ends the generation after
  // this token (a stop string matched): OnFinish follows, OK with kStop.
  virtual bool OnToken(int32_t token, const TokenLogprobs* logprobs) = 0;
  // Called exactly once, last. OK with the stats, or why it stopped.
  virtual void OnFinish(const absl::Status& status, const GenerationResult& result) = 0;
};

// Alternatives per position a request may ask log-probabilities for.
inline constexpr int kMaxTopLogprobs = 20;

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  // The tokenizer's end-of-sequence ids (text prompts): also end generation,
  // with FinishReason::kEos.
  std::vector<int32_t> eos_token_ids;
  // >= 0: compute each token's log-probability and this many alternatives
  // (the runner then returns the logits row, as for sampling); -1: none.
  int top_logprobs = -1;
  absl::Time arrival = FastNow();
  absl::Time deadline = absl::InfiniteFuture();
};

// A TransformerBlock call: hidden [B,S,D] fp32, positions [B,S].
struct BlockTask {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  int64_t batch = 0;
  int64_t seq_len = 0;
  std::vector<float> hidden;
  std::vector<int64_t> positions;
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;
  // Called once on the engine thread with the output hidden states or an error.
  std::function<void(absl::StatusOr<std::vector<float>>)> done;
};

class Engine {
 public:
  // Sizes the KV cache, starts the scheduler thread.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ModelRunner> runner, Metrics* metrics,
                                                        EngineOptions options);
  ~Engine();

  const ModelConfig& config() const { return runner_->config(); }
  const ModelRunner& runner() const { return *runner_; }
  const EngineOptions& options() const { return options_; }

  // Validates (INVALID_ARGUMENT naming the field) and queues a generation
  // (RESOURCE_EXHAUSTED when the waiting queue is full, UNAVAILABLE after
  // Shutdown). On error the sink is never called; on OK exactly one
  // OnFinish follows. max_new_tokens is capped by the limits.
  absl::Status Submit(GenerationRequest request, std::shared_ptr<GenerationSink> sink);
  // Queues a TransformerBlock call (already validated against config()):
  // INVALID_ARGUMENT over --max_block_tokens (or, chunked, a sequence longer
  // than --max_seq_len), RESOURCE_EXHAUSTED when the queue is full.
  absl::Status SubmitBlock(BlockTask task);
  // Makes the scheduler look at cancellations now (a sink was cancelled).
  void Wake();
  // Fails every queued and running request with UNAVAILABLE and joins the thread.
  void Shutdown();
  // When the tokens being handed to sinks were sampled (their step's end);
  // only meaningful inside GenerationSink::OnToken (the engine thread).
  absl::Time sampled_at() const { return sampled_at_; }

 private:
  struct Sequence;
  struct ActiveBlock;
  Engine(std::unique_ptr<ModelRunner> runner, Metrics* metrics, EngineOptions options, int64_t num_blocks);
  void Loop();
  // One scheduling step, in the order of the comment at the top.
  void Step();
  void DropStopped(absl::Time now);
  void ReserveNextPositions();
  void Admit(int64_t token_budget);
  void ForwardAndSample(int64_t token_budget);
  int64_t ChunkTokens() const;
  int64_t NextChunk(const Sequence& s) const;
  void FinishSequence(Sequence& seq, const absl::Status& status);
  void UpdateGauges();
  // Drops cancelled / past-deadline block calls, queued or running.
  void ExpireBlocks(absl::Time now);
  // Runs the next piece of the current block call (starting the next queued
  // one if none); returns the rows it ran (0: none, or one layer of all rows).
  int64_t RunBlockPiece(int64_t max_rows);
  void FinishBlock(absl::StatusOr<std::vector<float>> result);

  std::unique_ptr<ModelRunner> runner_;
  Metrics* const metrics_;
  EngineOptions options_;
  KvBlockAllocator blocks_;  // engine thread only

  absl::Mutex mu_;
  std::deque<std::unique_ptr<Sequence>> waiting_ ABSL_GUARDED_BY(mu_);
  std::deque<BlockTask> block_tasks_ ABSL_GUARDED_BY(mu_);
  int64_t queued_block_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // BlockBytes of block_tasks_
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::unique_ptr<Sequence>> running_;  // engine thread only, admission order
  std::unique_ptr<ActiveBlock> block_;              // engine thread only
  std::thread thread_;
  absl::Time sampled_at_ = absl::InfinitePast();  // see sampled_at()
  // When the last forward pass ended, if the step after it has not waited
  // for work since (InfinitePast otherwise): the start of the between-forwards span.
  absl::Time forward_end_ = absl::InfinitePast();
};

}  // namespace fusedserve
