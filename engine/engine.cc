// The generation engine's scheduler loop (see engine.h).
#include "engine/engine.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/clock.h"
#include "telemetry/log.h"

namespace fusedserve {

struct Engine::Sequence {
  GenerationRequest request;
  std::shared_ptr<GenerationSink> sink;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t prompt_len = 0;
  int64_t generated = 0;
  int64_t cached = 0;           // positions whose K/V are in the cache
  std::vector<int32_t> blocks;  // block table
  int64_t published = 0;        // leading blocks offered to the prefix cache
  int64_t prefix_hit = 0;       // prompt positions found in the prefix cache at first admission
  SamplerRng rng{0};
  bool counted = false;                         // prompt tokens already counted in the metrics
  FinishReason finish = FinishReason::kLength;  // why it ended, once it has
  absl::Time first_token_time = absl::InfinitePast();
  absl::Time last_token_time = absl::InfinitePast();
};

// The TransformerBlock call being run, with its progress.
struct Engine::ActiveBlock {
  BlockTask task;
  int64_t row = 0;                           // chunked: rows [0, row) of the flattened [B*S] ran through every layer
  int64_t layer = 0;                         // whole: layers done
  std::vector<std::vector<int32_t>> tables;  // chunked: [B] block tables, freed as each sequence ends
};

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ModelRunner> runner, Metrics* metrics,
                                                       EngineOptions o) {
  if (runner == nullptr) return absl::InvalidArgumentError("engine needs a model runner");
  if (o.kv_block_size <= 0) return absl::InvalidArgumentError("--kv_block_size must be positive");
  if (o.max_running <= 0) return absl::InvalidArgumentError("--max_running must be positive");
  if (o.max_waiting < 0) return absl::InvalidArgumentError("--max_waiting must be >= 0");
  if (o.max_batched_tokens <= 0) return absl::InvalidArgumentError("--max_batched_tokens must be positive");
  if (o.prefill_chunk_tokens < 0) return absl::InvalidArgumentError("--prefill_chunk_tokens must be >= 0");
  if (o.max_new_tokens_limit <= 0) return absl::InvalidArgumentError("--max_new_tokens_limit must be positive");
  if (o.max_block_tokens <= 0) return absl::InvalidArgumentError("--max_block_tokens must be positive");
  const ModelConfig& c = runner->config();
  int64_t blocks = o.kv_cache_blocks;
  if (blocks <= 0) {
    blocks = std::max<int64_t>(1, o.kv_cache_bytes / runner->KvBytesPerBlock(o.kv_block_size));
  }
  if (blocks > (int64_t{1} << 30)) return absl::InvalidArgumentError("--kv_cache_blocks is too large");
  const int64_t capacity = blocks * o.kv_block_size;
  int64_t max_seq = o.max_seq_len > 0 ? o.max_seq_len : std::min<int64_t>(c.max_position, 8192);
  if (max_seq > capacity) {
    LogWarning(absl::StrCat("max sequence length ", max_seq, " capped to the KV cache capacity (", blocks, " blocks x ",
                            o.kv_block_size, " = ", capacity, " positions)"));
    max_seq = capacity;
  }
  if (max_seq < 2) return absl::InvalidArgumentError("the KV cache holds fewer than 2 positions");
  o.max_seq_len = max_seq;
  if (absl::Status s = runner->InitKvCache(blocks, o.kv_block_size); !s.ok()) return s;
  std::unique_ptr<Engine> engine(new Engine(std::move(runner), metrics, o, blocks));
  engine->UpdateGauges();
  engine->thread_ = std::thread([e = engine.get()] { e->Loop(); });
  return engine;
}

Engine::Engine(std::unique_ptr<ModelRunner> runner, Metrics* metrics, EngineOptions options, int64_t num_blocks)
    : runner_(std::move(runner)),
      metrics_(metrics),
      options_(options),
      blocks_(num_blocks, options.kv_block_size, options.prefix_caching) {}

Engine::~Engine() { Shutdown(); }

absl::Status Engine::Submit(GenerationRequest r, std::shared_ptr<GenerationSink> sink) {
  const ModelConfig& c = config();
  if (r.prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids: at least one token is required");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_token_ids[", i, "] = ", r.prompt[i], " is outside the vocabulary [0, ", c.vocab, ")"));
    }
  }
  if (static_cast<int64_t>(r.prompt.size()) >= options_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_token_ids: ", r.prompt.size(),
                                                   " tokens leave no room to generate (max sequence length ",
                                                   options_.max_seq_len, ")"));
  }
  if (r.max_new_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens must be >= 1 (got ", r.max_new_tokens, ")"));
  }
  r.max_new_tokens = std::min<int64_t>(r.max_new_tokens, options_.max_new_tokens_limit);
  const SamplingParams& p = r.sampling;
  if (!(p.temperature >= 0.0f) || p.temperature > 1e4f) {
    return absl::InvalidArgumentError("temperature must be >= 0 (0 = greedy)");
  }
  if (p.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (got ", p.top_k, ")"));
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) return absl::InvalidArgumentError("top_p must be in [0, 1]");
  for (size_t i = 0; i < r.stop_token_ids.size(); ++i) {
    if (r.stop_token_ids[i] < 0 || r.stop_token_ids[i] >= c.vocab) {
      return absl::InvalidArgumentError(absl::StrCat("stop_token_ids[", i, "] = ", r.stop_token_ids[i],
                                                     " is outside the vocabulary [0, ", c.vocab, ")"));
    }
  }
  if (r.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs = ", r.top_logprobs, " is over the limit of ", kMaxTopLogprobs));
  }
  auto seq = std::make_unique<Sequence>();
  seq->tokens = r.prompt;
  seq->prompt_len = static_cast<int64_t>(r.prompt.size());
  seq->rng = SamplerRng(p.seed);
  seq->sink = std::move(sink);
  seq->request = std::move(r);
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("server is shutting down");
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting) {
      return absl::ResourceExhaustedError(
          absl::StrCat("generation queue is full (", options_.max_waiting, " requests waiting); retry later"));
    }
    waiting_.push_back(std::move(seq));
    if (metrics_ != nullptr) metrics_->requests_waiting().Set(static_cast<double>(waiting_.size()));
  }
  return absl::OkStatus();
}

namespace {

// What a queued block call holds: its hidden states and positions.
int64_t BlockBytes(const BlockTask& t) {
  return static_cast<int64_t>(t.hidden.size() * sizeof(float) + t.positions.size() * sizeof(int64_t));
}

}  // namespace

absl::Status Engine::SubmitBlock(BlockTask task) {
  const int64_t tokens = task.batch * task.seq_len;  // both <= the tensor element limit: no overflow
  if (tokens > options_.max_block_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("hidden: B x S = ", tokens,
                                                   " tokens exceed this server's limit per TransformerBlock call "
                                                   "(--max_block_tokens=",
                                                   options_.max_block_tokens, ")"));
  }
  // Chunked, a sequence's K/V sit in the KV cache, which holds max_seq_len positions.
  if (runner_->SupportsLayersChunked() && task.seq_len > options_.max_seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden: S = ", task.seq_len,
                     " is longer than this server's longest sequence (--max_seq_len=", options_.max_seq_len, ")"));
  }
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::UnavailableError("server is shutting down");
  if (static_cast<int64_t>(block_tasks_.size()) >= std::max(options_.max_waiting, 1)) {
    return absl::ResourceExhaustedError("TransformerBlock queue is full; retry later");
  }
  const int64_t bytes = BlockBytes(task);
  if (queued_block_bytes_ > 0 && queued_block_bytes_ + bytes > options_.max_queued_block_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("queued TransformerBlock calls hold ", queued_block_bytes_,
                                                     " bytes; ", bytes, " more would pass the server's limit of ",
                                                     options_.max_queued_block_bytes,
                                                     " (--max_queued_bytes); retry later"));
  }
  queued_block_bytes_ += bytes;
  block_tasks_.push_back(std::move(task));
  return absl::OkStatus();
}

void Engine::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

void Engine::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Engine::UpdateGauges() {
  if (metrics_ == nullptr) return;
  metrics_->requests_running().Set(static_cast<double>(running_.size()));
  metrics_->kv_cache_blocks_used().Set(static_cast<double>(blocks_.num_used()));
  metrics_->kv_cache_blocks_total().Set(static_cast<double>(blocks_.num_blocks()));
  metrics_->kv_cache_blocks_cached().Set(static_cast<double>(blocks_.num_cached_idle()));
  metrics_->kv_cache_blocks_shared().Set(static_cast<double>(blocks_.num_shared()));
}

void Engine::FinishSequence(Sequence& seq, const absl::Status& status) {
  blocks_.Free(&seq.blocks);
  GenerationResult r;
  r.prompt_tokens = seq.prompt_len;
  r.cached_prompt_tokens = seq.prefix_hit;
  r.generated_tokens = seq.generated;
  if (seq.generated > 0) {
    r.time_to_first_token_s = absl::ToDoubleSeconds(seq.first_token_time - seq.request.arrival);
    if (seq.generated > 1) {
      r.time_per_output_token_s =
          absl::ToDoubleSeconds(seq.last_token_time - seq.first_token_time) / static_cast<double>(seq.generated - 1);
      if (metrics_ != nullptr && status.ok()) metrics_->time_per_output_token().Observe(r.time_per_output_token_s);
    }
  }
  if (status.ok()) r.finish_reason = seq.finish;
  seq.sink->OnFinish(status, r);
}

void Engine::FinishBlock(absl::StatusOr<std::vector<float>> result) {
  std::unique_ptr<ActiveBlock> b = std::move(block_);
  for (auto& table : b->tables) blocks_.Free(&table);
  b->task.done(std::move(result));
}

void Engine::ExpireBlocks(absl::Time now) {
  // The deadline first: gRPC also cancels a call whose deadline passed.
  auto stop_reason = [now](BlockTask& t) -> absl::Status {
    if (now > t.deadline) return absl::DeadlineExceededError("deadline exceeded during TransformerBlock");
    if (t.cancelled && t.cancelled()) return absl::CancelledError("TransformerBlock cancelled");
    return absl::OkStatus();
  };
  if (block_ != nullptr) {
    if (absl::Status s = stop_reason(block_->task); !s.ok()) FinishBlock(s);
  }
  std::vector<std::pair<BlockTask, absl::Status>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = block_tasks_.begin(); it != block_tasks_.end();) {
      if (absl::Status s = stop_reason(*it); !s.ok()) {
        queued_block_bytes_ -= BlockBytes(*it);
        dropped.emplace_back(std::move(*it), s);
        it = block_tasks_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [t, s] : dropped) t.done(s);
}

int64_t Engine::RunBlockPiece(int64_t max_rows) {
  if (block_ == nullptr) {
    absl::MutexLock lock(&mu_);
    if (block_tasks_.empty()) return 0;
    block_ = std::make_unique<ActiveBlock>();
    queued_block_bytes_ -= BlockBytes(block_tasks_.front());
    block_->task = std::move(block_tasks_.front());
    block_tasks_.pop_front();
    block_->tables.resize(block_->task.batch);
  }
  ActiveBlock& a = *block_;
  BlockTask& t = a.task;
  const int64_t S = t.seq_len, total = t.batch * S;
  if (!runner_->SupportsLayersChunked()) {
    // The runner runs rows only whole: one layer of every row per step.
    if (absl::Status s =
            runner_->RunLayers(t.first_layer + a.layer, 1, t.batch, S, t.positions.data(), t.hidden.data());
        !s.ok()) {
      FinishBlock(s);
    } else if (++a.layer >= t.num_layers) {
      FinishBlock(std::move(t.hidden));
    }
    return std::min(total, max_rows);
  }
  // Rows [a.row, end) in sequence order; a chunk may end one sequence and
  // start the next. Each sequence's K/V go to blocks lent to it.
  std::vector<SeqForward> batch;
  const int64_t end = std::min(total, a.row + max_rows);
  int64_t r = a.row;
  while (r < end) {
    const int64_t b = r / S, i = r % S;
    int64_t n = std::min(end - r, S - i);
    std::vector<int32_t>& table = a.tables[b];
    bool cut = false;
    if (!blocks_.EnsureCapacity(&table, i + n)) {
      // Cache short: run as far as the free blocks reach; the rest waits.
      n = std::min(n, (static_cast<int64_t>(table.size()) + blocks_.num_free()) * blocks_.block_size() - i);
      if (n <= 0 || !blocks_.EnsureCapacity(&table, i + n)) break;
      cut = true;
    }
    SeqForward f;
    f.start = i;
    f.num_tokens = n;
    f.block_table = table.data();
    f.num_blocks = static_cast<int64_t>(table.size());
    batch.push_back(f);
    r += n;
    if (cut) break;
  }
  if (batch.empty()) return 0;
  const int64_t D = config().hidden;
  if (absl::Status s = runner_->RunLayersChunked(t.first_layer, t.num_layers, batch, t.positions.data() + a.row,
                                                 t.hidden.data() + a.row * D);
      !s.ok()) {
    FinishBlock(s);
    return r - a.row;
  }
  const int64_t rows = r - a.row;
  for (int64_t b = a.row / S; b < t.batch && (b + 1) * S <= r; ++b) blocks_.Free(&a.tables[b]);
  a.row = r;
  if (a.row == total) FinishBlock(std::move(t.hidden));
  return rows;
}

void Engine::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || wake_ || !waiting_.empty() || !block_tasks_.empty() || !running_.empty() || block_ != nullptr;
      };
      mu_.Await(absl::Condition(&has_work));
      if (stop_) break;
      wake_ = false;
    }
    Step();
  }
  // Shutting down: fail whatever is left.
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::deque<BlockTask> tasks;
  {
    absl::MutexLock lock(&mu_);
    waiting.swap(waiting_);
    tasks.swap(block_tasks_);
    queued_block_bytes_ = 0;
  }
  const absl::Status down = absl::UnavailableError("server is shutting down");
  for (auto& seq : running_) FinishSequence(*seq, down);
  running_.clear();
  for (auto& seq : waiting) FinishSequence(*seq, down);
  if (block_ != nullptr) FinishBlock(down);
  for (BlockTask& t : tasks) t.done(down);
  UpdateGauges();
  if (metrics_ != nullptr) metrics_->requests_waiting().Set(0);
}

void Engine::Step() {
  DropStopped(FastNow());
  ReserveNextPositions();
  // A piece of the current TransformerBlock call, like a running prompt's
  // next chunk: at most a chunk, from the budget the decodes leave (at least
  // one row, so it always advances).
  int64_t decodes = 0;
  for (const auto& s : running_) {
    decodes += s->cached >= s->prompt_len && static_cast<int64_t>(s->tokens.size()) - s->cached == 1;
  }
  const int64_t block_rows =
      RunBlockPiece(std::min(ChunkTokens(), std::max<int64_t>(1, options_.max_batched_tokens - decodes)));
  Admit(options_.max_batched_tokens - block_rows);
  UpdateGauges();
  if (!running_.empty()) {
    ForwardAndSample(options_.max_batched_tokens - block_rows);
    UpdateGauges();
  }
  // Nothing running: the loop may wait for work, so the next forward pass
  // does not follow this one at once.
  if (running_.empty()) forward_end_ = absl::InfinitePast();
}

int64_t Engine::ChunkTokens() const {
  return options_.prefill_chunk_tokens > 0 ? options_.prefill_chunk_tokens : std::numeric_limits<int64_t>::max();
}

int64_t Engine::NextChunk(const Sequence& s) const {
  return std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) - s.cached, ChunkTokens());
}

// 1. Cancelled / past-deadline sequences leave, running or waiting.
void Engine::DropStopped(absl::Time now) {
  // The deadline first: gRPC also cancels a call whose deadline passed.
  auto stop_reason = [now](Sequence& s) -> absl::Status {
    if (now > s.request.deadline) return absl::DeadlineExceededError("deadline exceeded during generation");
    if (s.sink->IsCancelled()) return absl::CancelledError("generation cancelled");
    return absl::OkStatus();
  };
  for (auto it = running_.begin(); it != running_.end();) {
    if (absl::Status s = stop_reason(**it); !s.ok()) {
      FinishSequence(**it, s);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  std::vector<std::pair<std::unique_ptr<Sequence>, absl::Status>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (absl::Status s = stop_reason(**it); !s.ok()) {
        dropped.emplace_back(std::move(*it), s);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [seq, s] : dropped) FinishSequence(*seq, s);
  ExpireBlocks(now);
}

// 2. Room for each running sequence's next position; when blocks run out,
// the newest sequence goes back to the head of the queue (its tokens are
// recomputed when it is readmitted, from the prefix cache where its blocks
// are still there; its sampler state is kept).
void Engine::ReserveNextPositions() {
  for (size_t i = 0; i < running_.size();) {
    Sequence& s = *running_[i];
    if (blocks_.EnsureCapacity(&s.blocks, static_cast<int64_t>(s.tokens.size()))) {
      ++i;
      continue;
    }
    std::unique_ptr<Sequence> victim = std::move(running_.back());
    running_.pop_back();
    blocks_.Free(&victim->blocks);
    victim->cached = 0;
    victim->published = 0;
    {
      absl::MutexLock lock(&mu_);
      waiting_.push_front(std::move(victim));
    }
    // Retry the same index (it may have been the victim itself).
  }
}

// 3. Admission, FIFO, within the running, token and block limits. The
// token budget left after the decodes, the block piece and the running
// prompts' next chunks decides whether a new prompt can start this step.
// A prompt starts after its longest prefix found in the prefix cache.
void Engine::Admit(int64_t budget) {
  const bool chunked = options_.prefill_chunk_tokens > 0;
  for (const auto& s : running_) budget -= NextChunk(*s);
  bool admitted_prefill = false;
  while (static_cast<int>(running_.size()) < options_.max_running) {
    std::unique_ptr<Sequence> seq;
    {
      absl::MutexLock lock(&mu_);
      if (waiting_.empty()) break;
      // Chunks: a new prompt starts while the step has room for part of it
      // (known before its prefix is looked up).
      if (chunked && budget <= 0) break;
      Sequence& head = *waiting_.front();
      const int64_t len = static_cast<int64_t>(head.tokens.size());
      // Shared blocks are never written: the last token is always computed.
      head.cached = blocks_.MatchPrefix(head.tokens.data(), len - 1, &head.blocks);
      head.published = static_cast<int64_t>(head.blocks.size());
      const int64_t need = NextChunk(head);
      // Whole prompts: the first admission of a step goes even over budget.
      if ((!chunked && need > budget && admitted_prefill) || !blocks_.EnsureCapacity(&head.blocks, len)) {
        blocks_.Free(&head.blocks);  // its shared blocks stay cached while it waits
        head.cached = 0;
        head.published = 0;
        break;
      }
      seq = std::move(waiting_.front());
      waiting_.pop_front();
      budget -= need;
      admitted_prefill = true;
      if (metrics_ != nullptr) metrics_->requests_waiting().Set(static_cast<double>(waiting_.size()));
    }
    if (!seq->counted) {
      seq->prefix_hit = std::min(seq->cached, seq->prompt_len);
      if (metrics_ != nullptr) {
        metrics_->prompt_tokens().Increment(static_cast<double>(seq->prompt_len));
        metrics_->prefix_cache_hit_tokens().Increment(static_cast<double>(seq->prefix_hit));
      }
    }
    seq->counted = true;
    running_.push_back(std::move(seq));
  }
}

// 4. One forward over the batch: decodes (one token each) and prompts,
// whole or (chunked) cut to what the step's budget leaves; then one token
// sampled per sequence whose prompt is done, streamed, finished sequences out.
void Engine::ForwardAndSample(int64_t left) {
  const bool chunked = options_.prefill_chunk_tokens > 0;
  std::vector<SeqForward> batch;
  std::vector<size_t> member;  // running_ index of each batch entry
  batch.reserve(running_.size());
  for (int pass = 0; pass < 2; ++pass) {  // decodes first, then prompts in admission order
    for (size_t i = 0; i < running_.size(); ++i) {
      Sequence& s = *running_[i];
      const int64_t uncached = static_cast<int64_t>(s.tokens.size()) - s.cached;
      const bool decode = s.cached >= s.prompt_len && uncached == 1;
      if (decode != (pass == 0)) continue;
      const int64_t n = chunked && !decode ? std::min(NextChunk(s), left) : uncached;
      if (n <= 0) continue;  // no room left this step
      left -= n;
      SeqForward f;
      f.start = s.cached;
      f.tokens = s.tokens.data() + s.cached;
      f.num_tokens = n;
      f.block_table = s.blocks.data();
      f.num_blocks = static_cast<int64_t>(s.blocks.size());
      // Logits only where a token is sampled from them: the prompt's last chunk or a decode.
      // Logprobs need the row too (the runner copies only the rows asked for).
      f.want_logits = (s.request.sampling.temperature > 0.0f || s.request.top_logprobs >= 0) &&
                      s.cached + n == static_cast<int64_t>(s.tokens.size());
      batch.push_back(f);
      member.push_back(i);
    }
  }
  if (batch.empty()) return;
  ForwardOutput out;
  const absl::Time start = FastNow();
  const absl::Status forwarded = runner_->Forward(batch, &out);
  const absl::Time t = FastNow();
  if (metrics_ != nullptr) {
    metrics_->engine_forward().Observe(absl::ToDoubleSeconds(t - start));
    if (forward_end_ != absl::InfinitePast())
      metrics_->engine_between_forwards().Observe(absl::ToDoubleSeconds(start - forward_end_));
  }
  forward_end_ = t;
  if (!forwarded.ok()) {
    LogError(absl::StrCat("forward step failed: ", forwarded.message()));
    for (auto& s : running_)
      FinishSequence(*s, absl::InternalError(absl::StrCat("forward failed: ", forwarded.message())));
    running_.clear();
    return;
  }
  sampled_at_ = t;
  const int64_t vocab = config().vocab;
  std::vector<bool> finished(running_.size(), false);
  for (size_t b = 0; b < batch.size(); ++b) {
    Sequence& s = *running_[member[b]];
    s.cached += batch[b].num_tokens;
    blocks_.Publish(s.tokens.data(), s.cached, s.blocks, &s.published);
    if (s.cached < static_cast<int64_t>(s.tokens.size())) continue;  // the prompt continues next step
    // Greedy takes the runner's argmax even where the row was copied for
    // logprobs, so asking for logprobs never changes the tokens.
    const bool sampled = s.request.sampling.temperature > 0.0f;
    const int32_t tok =
        sampled ? SampleToken(out.logits.data() + b * vocab, vocab, s.request.sampling, s.rng) : out.greedy[b];
    TokenLogprobs logprobs;
    if (s.request.top_logprobs >= 0) {
      ComputeLogprobs(out.logits.data() + b * vocab, vocab, tok, s.request.top_logprobs, &logprobs);
    }
    s.tokens.push_back(tok);
    ++s.generated;
    if (s.generated == 1) {
      s.first_token_time = t;
      if (metrics_ != nullptr) {
        metrics_->time_to_first_token().Observe(absl::ToDoubleSeconds(t - s.request.arrival));
      }
    }
    s.last_token_time = t;
    if (metrics_ != nullptr) metrics_->generated_tokens().Increment();
    const bool go_on = s.sink->OnToken(tok, s.request.top_logprobs >= 0 ? &logprobs : nullptr);
    const auto& stops = s.request.stop_token_ids;
    const auto& eos = s.request.eos_token_ids;
    bool done = true;
    if (!go_on || std::find(stops.begin(), stops.end(), tok) != stops.end()) {
      s.finish = FinishReason::kStop;
    } else if (std::find(eos.begin(), eos.end(), tok) != eos.end()) {
      s.finish = FinishReason::kEos;
    } else {
      done = s.generated >= s.request.max_new_tokens || static_cast<int64_t>(s.tokens.size()) >= options_.max_seq_len;
    }
    if (done) {
      FinishSequence(s, absl::OkStatus());
      finished[member[b]] = true;
    }
  }
  std::vector<std::unique_ptr<Sequence>> still;
  still.reserve(running_.size());
  for (size_t i = 0; i < running_.size(); ++i) {
    if (!finished[i]) still.push_back(std::move(running_[i]));
  }
  running_.swap(still);
}

}  // namespace fusedserve
