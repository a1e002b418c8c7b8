// Model loading, TransformerBlock validation and the Generate reactor.
#include "server/model_rpc.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"
#include "kernels/clock.h"
#include "server/grpc_status.h"
#include "telemetry/log.h"

namespace fusedserve {

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& model_dir, const std::string& preset,
                                                               uint64_t seed) {
  if (!model_dir.empty()) return ModelWeights::LoadCheckpoint(model_dir);
  absl::StatusOr<ModelConfig> config = PresetConfig(preset);
  if (!config.ok()) return config.status();
  return ModelWeights::Random(*config, seed);
}

void FillModelInfo(const ModelConfig& c, v1::ModelInfo* info) {
  info->set_name(c.name);
  info->set_hidden_size(static_cast<int32_t>(c.hidden));
  info->set_num_layers(static_cast<int32_t>(c.layers));
  info->set_num_q_heads(static_cast<int32_t>(c.q_heads));
  info->set_num_kv_heads(static_cast<int32_t>(c.kv_heads));
  info->set_head_dim(static_cast<int32_t>(c.head_dim));
  info->set_intermediate_size(static_cast<int32_t>(c.intermediate));
  info->set_vocab_size(static_cast<int32_t>(c.vocab));
  info->set_dtype(ToProtoDType(c.dtype));
}

absl::StatusOr<BlockTask> ValidateTransformerBlock(const v1::TransformerBlockRequest& req, const ModelConfig& c,
                                                   const ValidationLimits& limits) {
  if (!req.has_hidden()) return absl::InvalidArgumentError("hidden: required (a [B, S, D] float tensor)");
  absl::StatusOr<HostTensor> hidden = TensorFromProto(req.hidden(), "hidden", limits);
  if (!hidden.ok()) return hidden.status();
  if (!IsFloat(hidden->dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden: dtype ", DTypeName(hidden->dtype), " is not supported (F32, F16 or BF16)"));
  }
  if (hidden->rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("hidden: expected rank 3 [B, S, D], got rank ", hidden->rank()));
  }
  const int64_t B = hidden->dim(0), S = hidden->dim(1), D = hidden->dim(2);
  if (D != c.hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden: last dimension D = ", D, " does not match the model's hidden size ", c.hidden));
  }
  if (B < 1 || S < 1) return absl::InvalidArgumentError("hidden: B and S must be >= 1");
  if (req.first_layer() < 0 || req.first_layer() >= c.layers) {
    return absl::InvalidArgumentError(absl::StrCat("first_layer = ", req.first_layer(), " is outside [0, ", c.layers,
                                                   ") (the model has ", c.layers, " layers)"));
  }
  if (req.num_layers() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_layers = ", req.num_layers(), " must be >= 0 (0 = to the end)"));
  }
  const int64_t n = req.num_layers() == 0 ? c.layers - req.first_layer() : req.num_layers();
  if (req.first_layer() + n > c.layers) {
    return absl::InvalidArgumentError(absl::StrCat("first_layer + num_layers = ", req.first_layer() + n,
                                                   " exceeds the model's ", c.layers, " layers"));
  }
  BlockTask task;
  task.first_layer = req.first_layer();
  task.num_layers = n;
  task.batch = B;
  task.seq_len = S;
  task.hidden = hidden->ToFloat();
  // A NaN or Inf would poison every later row of its sequence; it is the
  // caller's input, so it is named here rather than found in the output.
  for (size_t i = 0; i < task.hidden.size(); ++i) {
    if (!std::isfinite(task.hidden[i])) {
      const int64_t row = static_cast<int64_t>(i) / D;
      return absl::InvalidArgumentError(absl::StrCat("hidden[", row / S, ", ", row % S, ", ",
                                                     static_cast<int64_t>(i) % D, "] = ", task.hidden[i],
                                                     " is not finite"));
    }
  }
  if (req.has_positions()) {
    absl::StatusOr<HostTensor> pos = TensorFromProto(req.positions(), "positions", limits);
    if (!pos.ok()) return pos.status();
    if (pos->dtype != DType::kI32 && pos->dtype != DType::kI64) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions: dtype ", DTypeName(pos->dtype), " is not supported (I32 or I64)"));
    }
    if (pos->rank() != 2 || pos->dim(0) != B || pos->dim(1) != S) {
      std::string shape;
      for (int64_t d : pos->shape) absl::StrAppend(&shape, shape.empty() ? "" : ", ", d);
      return absl::InvalidArgumentError(
          absl::StrCat("positions: expected shape [", B, ", ", S, "] (B, S of hidden), got [", shape, "]"));
    }
    task.positions = pos->ToInt64();
    for (size_t i = 0; i < task.positions.size(); ++i) {
      if (task.positions[i] < 0 || task.positions[i] > (int64_t{1} << 24)) {
        return absl::InvalidArgumentError(
            absl::StrCat("positions[", i / S, ", ", i % S, "] = ", task.positions[i], " is outside [0, 2^24]"));
      }
    }
  } else {
    task.positions.resize(B * S);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < S; ++s) task.positions[b * S + s] = s;
    }
  }
  return task;
}

void StartTransformerBlock(Engine* engine, grpc::ServerContextBase* ctx, const v1::TransformerBlockRequest* request,
                           v1::TransformerBlockResponse* response, const ValidationLimits& limits,
                           std::function<void(const absl::Status&)> finish) {
  if (engine == nullptr) {
    finish(absl::UnimplementedError("TransformerBlock: no model is loaded in this server"));
    return;
  }
  absl::StatusOr<BlockTask> task = ValidateTransformerBlock(*request, engine->config(), limits);
  if (!task.ok()) {
    finish(task.status());
    return;
  }
  const DType out_dtype = FromProtoDType(request->hidden().dtype());
  std::vector<int64_t> shape = {task->batch, task->seq_len, engine->config().hidden};
  task->deadline = absl::FromChrono(ctx->deadline());
  task->cancelled = [ctx] { return ctx->IsCancelled(); };
  task->done = [response, out_dtype, shape, finish](absl::StatusOr<std::vector<float>> out) {
    // Finite input can still overflow (|x| near FLT_MAX): such values are
    // returned as computed, like any other, not as a server error.
    if (out.ok()) {
      TensorToProto(HostTensor::FromFloat(out_dtype, shape, *out), response->mutable_hidden());
    }
    finish(out.status());
  };
  if (absl::Status s = engine->SubmitBlock(*std::move(task)); !s.ok()) finish(s);
}

namespace {

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    default:
      return v1::FINISH_REASON_UNSPECIFIED;
  }
}

class GenerateCall;

// Writes Generate messages off the engine thread. Serializing a message and
// starting its write on the engine thread cost every stream several µs per
// step (64 streams: a large part of a ~2 ms decode step, during which the GPU
// waits); the engine thread now only appends the token, and queues the call
// here when no write of its is in flight (one in flight is followed up by
// OnWriteDone on a gRPC thread, with every token queued meanwhile).
class StreamWriters {
 public:
  // Process-wide, started on first use with SetGenerateWriterThreads' count;
  // its threads live as long as the process. Null with no threads.
  static StreamWriters* Get() {
    static StreamWriters* writers = threads_wanted > 0 ? new StreamWriters(threads_wanted) : nullptr;
    return writers;
  }
  static inline int threads_wanted = 2;
  void Schedule(std::shared_ptr<GenerateCall> call) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(call));
  }

 private:
  explicit StreamWriters(int threads) {
    for (int i = 0; i < threads; ++i) std::thread([this] { Loop(); }).detach();
  }
  void Loop();

  absl::Mutex mu_;
  std::deque<std::shared_ptr<GenerateCall>> queue_ ABSL_GUARDED_BY(mu_);
};

// One Generate call: the engine's sink and the events of its GenerateStream
// (the gRPC side) in one object. The engine pushes tokens and the final
// status from its thread; gRPC calls OnWriteDone / OnCancel / OnDone from its
// threads. Decisions are made under mu_; the stream's Write and End are
// called outside it, never on the engine thread (StreamWriters). One write at a time:
// tokens that arrive while a write is in flight are merged into the next
// message, so memory stays bounded however slowly the client reads. The
// object is shared by the engine and gRPC (self_ until OnDone), so neither
// side can free it under the other.
class GenerateCall final : public GenerationSink,
                           public GenerateStreamEvents,
                           public std::enable_shared_from_this<GenerateCall> {
 public:
  GenerateCall(GenerateStream* stream, Engine* engine, Metrics* metrics, absl::Time start, absl::Time deadline,
               std::function<void()> on_done)
      : stream_out_(stream),
        engine_(engine),
        metrics_(metrics),
        start_(start),
        deadline_(deadline),
        on_done_(std::move(on_done)) {
    stream->events = this;
  }

  // Must be called once, right after construction.
  void KeepAliveUntilDone() { self_ = shared_from_this(); }

  // Before Submit: the stream's text (with a tokenizer), its logprobs' token
  // texts, and whether decode time is recorded (text prompts).
  void SetText(const TextSupport* text, std::unique_ptr<TextStream> stream, bool logprobs, bool record_time) {
    text_ = text;
    stream_ = std::move(stream);
    logprobs_ = logprobs;
    record_time_ = record_time;
  }

  // GenerationSink (engine thread).
  bool IsCancelled() override { return cancelled_.load(); }
  bool OnToken(int32_t token, const TokenLogprobs* lp) override {
    // The text work runs outside mu_: only the engine thread touches stream_.
    std::string piece;
    bool matched = false;
    if (stream_ != nullptr) {
      const absl::Time t0 = FastNow();
      piece = stream_->Push(token, &matched);
      decode_time_ += FastNow() - t0;
    }
    v1::PositionLogprobs position;
    if (lp != nullptr && logprobs_) {
      FillLogprob(token, lp->logprob, position.mutable_chosen());
      for (const auto& [id, logprob] : lp->top) FillLogprob(id, logprob, position.add_top());
    }
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return false;
      if (pending_.token_ids_size() == 0) pending_sampled_ = engine_ != nullptr ? engine_->sampled_at() : FastNow();
      pending_.add_token_ids(token);
      pending_.mutable_text()->append(piece);
      if (lp != nullptr && logprobs_) *pending_.add_logprobs() = std::move(position);
    }
    ScheduleWrite();
    return !matched;
  }
  void OnFinish(const absl::Status& status, const GenerationResult& result) override {
    std::string tail;
    if (stream_ != nullptr && status.ok()) {
      const absl::Time t0 = FastNow();
      tail = stream_->Flush();
      decode_time_ += FastNow() - t0;
    }
    if (record_time_ && metrics_ != nullptr) {
      metrics_->tokenizer_time("decode").Observe(absl::ToDoubleSeconds(decode_time_));
    }
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      finishing_ = true;
      final_status_ = status;
      if (status.ok()) {
        v1::GenerationStats* st = pending_.mutable_stats();
        st->set_prompt_tokens(static_cast<int32_t>(result.prompt_tokens));
        st->set_cached_prompt_tokens(static_cast<int32_t>(result.cached_prompt_tokens));
        st->set_generated_tokens(static_cast<int32_t>(result.generated_tokens));
        st->set_time_to_first_token_seconds(result.time_to_first_token_s);
        st->set_time_per_output_token_seconds(result.time_per_output_token_s);
        st->set_finish_reason(ToProto(result.finish_reason));
        pending_.mutable_text()->append(tail);
      } else {
        pending_.Clear();  // the stream ends with the error instead
      }
    }
    ScheduleWrite();
  }

  // Ends the call at once (validation error, queue full, ...).
  void FinishNow(const absl::Status& s) {
    record_time_ = false;
    OnFinish(s, GenerationResult{});
  }

  // GenerateStreamEvents.
  void OnWriteDone(bool ok) override {
    if (ok && metrics_ != nullptr && in_flight_sampled_ != absl::InfinitePast()) {
      // The oldest token of the message just sent: sampled -> left the server.
      metrics_->token_send().Observe(absl::ToDoubleSeconds(FastNow() - in_flight_sampled_));
    }
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        // The client is gone: stop generating, drop what is queued.
        cancelled_.store(true);
        pending_.Clear();
      }
    }
    if (!ok && engine_ != nullptr) engine_->Wake();
    Pump();
  }
  void OnCancel() override {
    cancelled_.store(true);
    if (engine_ != nullptr) engine_->Wake();
  }
  void OnDone() override {
    if (on_done_) on_done_();
    std::shared_ptr<GenerateCall> last = std::move(self_);  // may free this on return
  }

 private:
  friend class StreamWriters;

  // Engine thread: hands the next write (or the Finish) to a StreamWriters
  // thread, unless a write is in flight (its OnWriteDone pumps) or the call
  // is queued there already.
  void ScheduleWrite() {
    StreamWriters* writers = StreamWriters::Get();
    if (writers == nullptr) {
      Pump();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || write_queued_ || finish_started_) return;
      write_queued_ = true;
    }
    writers->Schedule(shared_from_this());
  }
  // StreamWriters thread.
  void WriteQueued() {
    {
      absl::MutexLock lock(&mu_);
      write_queued_ = false;
    }
    Pump();
  }

  // Starts the next write, or the Finish once nothing is left to write.
  void Pump() {
    enum { kNothing, kWrite, kFinish } action = kNothing;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finish_started_) return;
      const bool has_payload = pending_.token_ids_size() > 0 || pending_.has_stats() || !pending_.text().empty();
      if (has_payload && !cancelled_.load()) {
        in_flight_.Swap(&pending_);
        pending_.Clear();
        in_flight_sampled_ = in_flight_.token_ids_size() > 0 ? pending_sampled_ : absl::InfinitePast();
        writing_ = true;
        action = kWrite;
      } else if (finishing_) {
        finish_started_ = true;
        status = final_status_;
        // gRPC cancels a call whose deadline passed; it ends (and is counted)
        // as expired. The client's own deadline timer cancels the stream up
        // to a transit time before ours (the server's deadline counts from
        // the request's arrival), hence the slack.
        constexpr absl::Duration kClientDeadlineSlack = absl::Milliseconds(50);
        if (absl::IsCancelled(status) && FastNow() >= deadline_ - kClientDeadlineSlack) {
          status = absl::DeadlineExceededError("deadline exceeded during generation");
        }
        action = kFinish;
      }
    }
    if (action == kWrite) {
      // Generate is registered raw (see ParseRequest): the reactor writes bytes.
      bool own = false;
      in_flight_bytes_.Clear();  // the previous write's, done by now
      const grpc::Status serialized =
          grpc::SerializationTraits<v1::GenerateResponse>::Serialize(in_flight_, &in_flight_bytes_, &own);
      if (serialized.ok()) {
        stream_out_->Write(&in_flight_bytes_);
        return;
      }
      {
        absl::MutexLock lock(&mu_);
        finish_started_ = true;
      }
      cancelled_.store(true);
      if (engine_ != nullptr) engine_->Wake();
      status = absl::InternalError("Generate: cannot serialize a response: " + serialized.error_message());
      action = kFinish;
    }
    if (action == kFinish) {
      const grpc::Status g = ToGrpcStatus(status);
      if (metrics_ != nullptr) {
        metrics_->RecordRequest("Generate", "", GrpcCodeName(g.error_code()),
                                absl::ToDoubleSeconds(FastNow() - start_));
      }
      stream_out_->End(g);
    }
  }

  void FillLogprob(int32_t id, float logprob, v1::TokenLogprob* out) const {
    out->set_token_id(id);
    out->set_logprob(logprob);
    if (text_ != nullptr) out->set_text(text_->TokenText(id));
  }

  GenerateStream* const stream_out_;  // lives until OnDone
  Engine* const engine_;
  Metrics* const metrics_;
  const TextSupport* text_ = nullptr;   // set before Submit, then read-only
  std::unique_ptr<TextStream> stream_;  // engine thread only (after Submit)
  bool logprobs_ = false;
  bool record_time_ = false;
  absl::Duration decode_time_;  // engine thread only
  const absl::Time start_;
  const absl::Time deadline_;
  const std::function<void()> on_done_;
  std::shared_ptr<GenerateCall> self_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  v1::GenerateResponse pending_ ABSL_GUARDED_BY(mu_);  // tokens (and stats) not yet written
  v1::GenerateResponse in_flight_;                     // the message being written
  grpc::ByteBuffer in_flight_bytes_;                   // ... serialized
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_queued_ ABSL_GUARDED_BY(mu_) = false;    // in StreamWriters' queue
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;       // final status known
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;  // Finish called
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);

  // When the first token of pending_ / in_flight_ was sampled (in_flight_:
  // InfinitePast when it carries none), for fusedserve_generate_token_send_seconds.
  absl::Time pending_sampled_ ABSL_GUARDED_BY(mu_);
  absl::Time in_flight_sampled_ = absl::InfinitePast();
};

void StreamWriters::Loop() {
  for (;;) {
    std::shared_ptr<GenerateCall> call;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](std::deque<std::shared_ptr<GenerateCall>>* q) { return !q->empty(); }, &queue_));
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    call->WriteQueued();
  }
}

}  // namespace

namespace {

// The first string field of a serialized `type` message (nested messages
// included) whose bytes are not valid UTF-8, as "path: ...", or "".
std::string FindInvalidUtf8Field(const google::protobuf::Descriptor* type, const std::string& bytes,
                                 const std::string& prefix, int depth) {
  google::protobuf::UnknownFieldSet fields;
  if (depth > 4 || !fields.ParseFromString(bytes)) return "";
  absl::flat_hash_map<int, int> seen;  // repeated fields' next index
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    const google::protobuf::FieldDescriptor* d = type->FindFieldByNumber(f.number());
    if (d == nullptr || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    std::string path = prefix + d->name();
    if (d->is_repeated()) absl::StrAppend(&path, "[", seen[f.number()]++, "]");
    if (d->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      if (std::optional<size_t> bad = InvalidUtf8Offset(f.length_delimited()); bad.has_value()) {
        return absl::StrCat(path, ": not valid UTF-8 (byte offset ", *bad, ")");
      }
    } else if (d->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      std::string inner = FindInvalidUtf8Field(d->message_type(), f.length_delimited(), path + ".", depth + 1);
      if (!inner.empty()) return inner;
    }
  }
  return "";
}

}  // namespace

// Parses a raw request body. Generate and Tokenize are registered raw so
// that text that is not valid UTF-8 (which protobuf refuses to parse, and
// gRPC's typed handlers then answer UNIMPLEMENTED with no message) gets
// INVALID_ARGUMENT naming the field.
absl::Status ParseRequest(const grpc::ByteBuffer& raw, const std::string& method, google::protobuf::Message* out) {
  grpc::ByteBuffer body(raw);  // Deserialize consumes its buffer; the copy shares the slices
  grpc::Slice slice;
  if (!body.TrySingleSlice(&slice).ok() && !body.DumpToSingleSlice(&slice).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(method, ": unreadable request body"));
  }
  if (out->ParseFromArray(slice.begin(), static_cast<int>(slice.size()))) return absl::OkStatus();
  const std::string bytes(reinterpret_cast<const char*>(slice.begin()), slice.size());
  if (std::string bad = FindInvalidUtf8Field(out->GetDescriptor(), bytes, "", 0); !bad.empty()) {
    return absl::InvalidArgumentError(bad);
  }
  return absl::InvalidArgumentError(absl::StrCat(method, ": the request body (", bytes.size(),
                                                 " bytes) is not a valid ", out->GetDescriptor()->full_name(),
                                                 "; check that the client was generated from this server's "
                                                 "fusedserve/v1/fusedserve.proto"));
}

namespace {

// The prompt (ids, text or chat turns), stop strings, logprobs and special
// token choices of a Generate request, into `r` and the stream's text state.
// `text` may be null (no tokenizer at all).
absl::Status PrepareGenerate(const v1::GenerateRequest& q, const TextSupport* text, const Engine& engine,
                             Metrics* metrics, GenerationRequest* r, std::unique_ptr<TextStream>* stream,
                             bool* text_prompt) {
  const int given = (q.prompt_token_ids_size() > 0) + !q.prompt().empty() + (q.messages_size() > 0);
  if (given != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("give exactly one of prompt_token_ids, prompt (text) and messages (chat turns); this request has ",
                     given == 0 ? "none" : "several"));
  }
  const TextSupport no_text("this server has no tokenizer");
  const TextSupport& t = text != nullptr ? *text : no_text;
  *text_prompt = q.prompt_token_ids_size() == 0;
  if (*text_prompt) {
    const absl::Time t0 = FastNow();
    absl::StatusOr<std::vector<int32_t>> ids =
        q.messages_size() > 0
            ? t.EncodeChat(q.messages())
            : t.EncodeText("prompt", q.prompt(), q.has_add_special_tokens() ? q.add_special_tokens() : true);
    if (!ids.ok()) return ids.status();
    if (metrics != nullptr) metrics->tokenizer_time("encode").Observe(absl::ToDoubleSeconds(FastNow() - t0));
    const char* field = q.messages_size() > 0 ? "messages" : "prompt";
    if (ids->empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": encodes to no tokens"));
    if (static_cast<int64_t>(ids->size()) >= engine.options().max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": encodes to ", ids->size(),
                                                     " tokens, which leave no room to generate (max sequence length ",
                                                     engine.options().max_seq_len, ")"));
    }
    r->prompt = *std::move(ids);
    if (!q.ignore_eos()) r->eos_token_ids = t.tokenizer()->eos_ids();
  } else {
    r->prompt.assign(q.prompt_token_ids().begin(), q.prompt_token_ids().end());
  }
  if (q.stop_size() > 0) {
    if (absl::Status s = t.CheckAvailable("stop"); !s.ok()) return s;
    if (q.stop_size() > kMaxStopStrings) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop: ", q.stop_size(), " strings; at most ", kMaxStopStrings, " are accepted"));
    }
    for (int i = 0; i < q.stop_size(); ++i) {
      const std::string& s = q.stop(i);
      if (s.empty() || s.size() > kMaxStopBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("stop[", i, "]: must be 1 to ", kMaxStopBytes, " bytes (got ", s.size(), ")"));
      }
      if (std::optional<size_t> bad = InvalidUtf8Offset(s); bad.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat("stop[", i, "]: not valid UTF-8 (byte offset ", *bad, ")"));
      }
    }
  }
  if (q.top_logprobs() < 0 || q.top_logprobs() > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs = ", q.top_logprobs(), " is outside [0, ", kMaxTopLogprobs, "]"));
  }
  if (q.top_logprobs() > 0 && !q.logprobs()) {
    return absl::InvalidArgumentError("top_logprobs needs logprobs = true");
  }
  r->top_logprobs = q.logprobs() ? q.top_logprobs() : -1;
  // Text goes with every stream where the server has a tokenizer (token-id
  // prompts too: it costs little and saves the client a tokenizer).
  if (t.tokenizer() != nullptr) {
    *stream = std::make_unique<TextStream>(*t.tokenizer(), q.has_skip_special_tokens() ? q.skip_special_tokens() : true,
                                           std::vector<std::string>(q.stop().begin(), q.stop().end()));
  }
  return absl::OkStatus();
}

}  // namespace

void StartGenerate(Engine* engine, Metrics* metrics, const TextSupport* text, const absl::Status& accepting,
                   absl::Time deadline, const grpc::ByteBuffer& raw_request, GenerateStream* stream,
                   std::function<void()> on_done) {
  const absl::Time start = FastNow();
  auto call = std::make_shared<GenerateCall>(stream, engine, metrics, start, deadline, std::move(on_done));
  call->KeepAliveUntilDone();
  GenerateCall* reactor = call.get();
  if (engine == nullptr) {
    reactor->FinishNow(absl::UnimplementedError("Generate: no model is loaded in this server"));
    return;
  }
  if (!accepting.ok()) {
    reactor->FinishNow(accepting);
    return;
  }
  v1::GenerateRequest parsed;
  if (absl::Status s = ParseRequest(raw_request, "Generate", &parsed); !s.ok()) {
    reactor->FinishNow(s);
    return;
  }
  const v1::GenerateRequest* request = &parsed;
  GenerationRequest r;
  std::unique_ptr<TextStream> text_stream;
  bool text_prompt = false;
  if (absl::Status s = PrepareGenerate(*request, text, *engine, metrics, &r, &text_stream, &text_prompt); !s.ok()) {
    reactor->FinishNow(s);
    return;
  }
  call->SetText(text, std::move(text_stream), request->logprobs(), text_prompt);
  r.max_new_tokens = request->max_new_tokens();
  r.sampling.temperature = request->temperature();
  r.sampling.top_k = request->top_k();
  r.sampling.top_p = request->top_p();
  r.sampling.seed = request->seed();
  r.stop_token_ids.assign(request->stop_token_ids().begin(), request->stop_token_ids().end());
  r.arrival = start;
  r.deadline = deadline;  // the same as the call's
  if (absl::Status s = engine->Submit(std::move(r), std::move(call)); !s.ok()) reactor->FinishNow(s);
}

namespace {

// Generate on the callback API: the reactor forwards its reactions to the
// call's events and deletes itself once done.
class CallbackGenerateStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public GenerateStream {
 public:
  void Write(const grpc::ByteBuffer* message) override { StartWrite(message); }
  void End(const grpc::Status& status) override { Finish(status); }
  void OnWriteDone(bool ok) override { events->OnWriteDone(ok); }
  void OnCancel() override { events->OnCancel(); }
  void OnDone() override {
    events->OnDone();
    delete this;
  }
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewCallbackGenerateStream(GenerateStream** stream) {
  auto* s = new CallbackGenerateStream;
  *stream = s;
  return s;
}

void SetGenerateWriterThreads(int threads) { StreamWriters::threads_wanted = std::max(0, threads); }

absl::Status Tokenize(const TextSupport* text, const grpc::ByteBuffer& raw_request, grpc::ByteBuffer* raw_response) {
  v1::TokenizeRequest request;
  if (absl::Status s = ParseRequest(raw_request, "Tokenize", &request); !s.ok()) return s;
  v1::TokenizeResponse response;
  if (absl::Status s = Tokenize(text, request, &response); !s.ok()) return s;
  bool own = false;
  const grpc::Status g = grpc::SerializationTraits<v1::TokenizeResponse>::Serialize(response, raw_response, &own);
  if (!g.ok()) return absl::InternalError("Tokenize: " + g.error_message());
  return absl::OkStatus();
}

absl::Status Tokenize(const TextSupport* text, const v1::TokenizeRequest& request, v1::TokenizeResponse* response) {
  if (text == nullptr) return absl::FailedPreconditionError("Tokenize: this server has no tokenizer");
  const bool has_text = !request.text().empty();
  if (has_text == (request.messages_size() > 0)) {
    return absl::InvalidArgumentError("give exactly one of text and messages");
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      has_text ? text->EncodeText("text", request.text(),
                                  request.has_add_special_tokens() ? request.add_special_tokens() : true)
               : text->EncodeChat(request.messages());
  if (!ids.ok()) return ids.status();
  response->mutable_token_ids()->Reserve(static_cast<int>(ids->size()));
  for (int32_t id : *ids) {
    response->add_token_ids(id);
    response->add_tokens(text->TokenText(id));
  }
  return absl::OkStatus();
}

absl::Status Detokenize(const TextSupport* text, int64_t vocab, const v1::DetokenizeRequest& request,
                        v1::DetokenizeResponse* response) {
  if (text == nullptr) return absl::FailedPreconditionError("Detokenize: this server has no tokenizer");
  if (absl::Status s = text->CheckAvailable("Detokenize"); !s.ok()) return s;
  for (int i = 0; i < request.token_ids_size(); ++i) {
    if (request.token_ids(i) < 0 || request.token_ids(i) >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_ids[", i, "] = ", request.token_ids(i), " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  response->set_text(text->tokenizer()->Decode(
      request.token_ids(), request.has_skip_special_tokens() ? request.skip_special_tokens() : true));
  return absl::OkStatus();
}

}  // namespace fusedserve
