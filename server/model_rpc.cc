// Model loading, TransformerBlock validation and the Generate reactor.
#include "server/model_rpc.h"

#include <atomic>
#include <cmath>
#include <deque>

#include "absl/strings/str_cat.h"
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

void StartTransformerBlock(Engine* engine, grpc::CallbackServerContext* ctx, const v1::TransformerBlockRequest* request,
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
    default:
      return v1::FINISH_REASON_UNSPECIFIED;
  }
}

// One Generate call: the gRPC reactor and the engine's sink in one object.
// The engine pushes tokens and the final status from its thread; gRPC calls
// OnWriteDone / OnCancel / OnDone from its threads. Decisions are made under
// mu_; StartWrite and Finish are called outside it. One write at a time:
// tokens that arrive while a write is in flight are merged into the next
// message, so memory stays bounded however slowly the client reads. The
// object is shared by the engine and gRPC (self_ until OnDone), so neither
// side can free it under the other.
class GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                           public GenerationSink,
                           public std::enable_shared_from_this<GenerateCall> {
 public:
  GenerateCall(Engine* engine, Metrics* metrics, absl::Time start, absl::Time deadline, std::function<void()> on_done)
      : engine_(engine), metrics_(metrics), start_(start), deadline_(deadline), on_done_(std::move(on_done)) {}

  // Must be called once, right after construction.
  void KeepAliveUntilDone() { self_ = shared_from_this(); }

  // GenerationSink (engine thread).
  bool IsCancelled() override { return cancelled_.load(); }
  void OnToken(int32_t token) override {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      if (pending_.token_ids_size() == 0) pending_sampled_ = engine_ != nullptr ? engine_->sampled_at() : absl::Now();
      pending_.add_token_ids(token);
    }
    Pump();
  }
  void OnFinish(const absl::Status& status, const GenerationResult& result) override {
    {
      absl::MutexLock lock(&mu_);
      if (finishing_) return;
      finishing_ = true;
      final_status_ = status;
      if (status.ok()) {
        v1::GenerationStats* st = pending_.mutable_stats();
        st->set_prompt_tokens(static_cast<int32_t>(result.prompt_tokens));
        st->set_generated_tokens(static_cast<int32_t>(result.generated_tokens));
        st->set_time_to_first_token_seconds(result.time_to_first_token_s);
        st->set_time_per_output_token_seconds(result.time_per_output_token_s);
        st->set_finish_reason(ToProto(result.finish_reason));
      } else {
        pending_.Clear();  // the stream ends with the error instead
      }
    }
    Pump();
  }

  // Ends the call at once (validation error, queue full, ...).
  void FinishNow(const absl::Status& s) { OnFinish(s, GenerationResult{}); }

  // gRPC reactions.
  void OnWriteDone(bool ok) override {
    if (ok && metrics_ != nullptr && in_flight_sampled_ != absl::InfinitePast()) {
      // The oldest token of the message just sent: sampled -> left the server.
      metrics_->token_send().Observe(absl::ToDoubleSeconds(absl::Now() - in_flight_sampled_));
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
  // Starts the next write, or the Finish once nothing is left to write.
  void Pump() {
    enum { kNothing, kWrite, kFinish } action = kNothing;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finish_started_) return;
      const bool has_payload = pending_.token_ids_size() > 0 || pending_.has_stats();
      if (has_payload && !cancelled_.load()) {
        in_flight_.Swap(&pending_);
        pending_.Clear();
        in_flight_sampled_ = in_flight_.token_ids_size() > 0 ? pending_sampled_ : absl::InfinitePast();
        writing_ = true;
        action = kWrite;
      } else if (finishing_) {
        finish_started_ = true;
        status = final_status_;
        // gRPC cancels a call whose deadline passed; it ends (and is counted) as expired.
        if (absl::IsCancelled(status) && absl::Now() >= deadline_) {
          status = absl::DeadlineExceededError("deadline exceeded during generation");
        }
        action = kFinish;
      }
    }
    if (action == kWrite) {
      StartWrite(&in_flight_);
    } else if (action == kFinish) {
      const grpc::Status g = ToGrpcStatus(status);
      if (metrics_ != nullptr) {
        metrics_->RecordRequest("Generate", "", GrpcCodeName(g.error_code()),
                                absl::ToDoubleSeconds(absl::Now() - start_));
      }
      Finish(g);
    }
  }

  Engine* const engine_;
  Metrics* const metrics_;
  const absl::Time start_;
  const absl::Time deadline_;
  const std::function<void()> on_done_;
  std::shared_ptr<GenerateCall> self_;
  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  v1::GenerateResponse pending_ ABSL_GUARDED_BY(mu_);  // tokens (and stats) not yet written
  v1::GenerateResponse in_flight_;                     // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;       // final status known
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;  // Finish called
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);

  // When the first token of pending_ / in_flight_ was sampled (in_flight_:
  // InfinitePast when it carries none), for fusedserve_generate_token_send_seconds.
  absl::Time pending_sampled_ ABSL_GUARDED_BY(mu_);
  absl::Time in_flight_sampled_ = absl::InfinitePast();
};

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* StartGenerate(Engine* engine, Metrics* metrics,
                                                              const absl::Status& accepting,
                                                              grpc::CallbackServerContext* ctx,
                                                              const v1::GenerateRequest* request,
                                                              std::function<void()> on_done) {
  const absl::Time start = absl::Now();
  auto call =
      std::make_shared<GenerateCall>(engine, metrics, start, absl::FromChrono(ctx->deadline()), std::move(on_done));
  call->KeepAliveUntilDone();
  GenerateCall* reactor = call.get();
  if (engine == nullptr) {
    reactor->FinishNow(absl::UnimplementedError("Generate: no model is loaded in this server"));
    return reactor;
  }
  if (!accepting.ok()) {
    reactor->FinishNow(accepting);
    return reactor;
  }
  GenerationRequest r;
  r.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  r.max_new_tokens = request->max_new_tokens();
  r.sampling.temperature = request->temperature();
  r.sampling.top_k = request->top_k();
  r.sampling.top_p = request->top_p();
  r.sampling.seed = request->seed();
  r.stop_token_ids.assign(request->stop_token_ids().begin(), request->stop_token_ids().end());
  r.arrival = start;
  r.deadline = absl::FromChrono(ctx->deadline());  // the same as the reactor's
  if (absl::Status s = engine->Submit(std::move(r), std::move(call)); !s.ok()) reactor->FinishNow(s);
  return reactor;
}

}  // namespace fusedserve
