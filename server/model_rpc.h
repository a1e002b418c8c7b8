// The model's RPC glue, kept out of service.cc: loading the model at start-up,
// ModelInfo, TransformerBlock validation, and the Generate stream reactor
// that connects the engine (which never blocks) to gRPC (one write in flight;
// tokens produced meanwhile are merged into the next message).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "fusedserve/v1/fusedserve.grpc.pb.h"
#include "server/text.h"
#include "server/validation.h"
#include "telemetry/metrics.h"

namespace fusedserve {

// Weights from --model (a checkpoint directory) when set, else random
// weights for --model_preset from --seed.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& model_dir, const std::string& preset,
                                                               uint64_t seed);

void FillModelInfo(const ModelConfig& config, v1::ModelInfo* info);

// Checks a TransformerBlock request against the hosted model and converts it
// to an engine task (done/cancelled left for the caller).
absl::StatusOr<BlockTask> ValidateTransformerBlock(const v1::TransformerBlockRequest& request,
                                                   const ModelConfig& config, const ValidationLimits& limits);

// Runs a TransformerBlock call through the engine; `finish` is called once
// (possibly on the engine thread) after `response` is filled or with an error.
void StartTransformerBlock(Engine* engine, grpc::ServerContextBase* ctx, const v1::TransformerBlockRequest* request,
                           v1::TransformerBlockResponse* response, const ValidationLimits& limits,
                           std::function<void(const absl::Status&)> finish);

// What a Generate stream reports to its call (on gRPC's threads): the last
// write's completion, the client's cancellation, the end of the call.
class GenerateStreamEvents {
 public:
  virtual void OnWriteDone(bool ok) = 0;
  virtual void OnCancel() = 0;
  virtual void OnDone() = 0;

 protected:
  ~GenerateStreamEvents() = default;
};

// The gRPC side of a Generate stream: the callback API's reactor or an
// async-API call. One Write in flight at a time; End once, with no write in
// flight; afterwards OnDone comes once and the stream may be gone.
class GenerateStream {
 public:
  virtual ~GenerateStream() = default;
  virtual void Write(const grpc::ByteBuffer* message) = 0;
  virtual void End(const grpc::Status& status) = 0;
  GenerateStreamEvents* events = nullptr;  // set by StartGenerate, before anything is written
};

// Starts one Generate call on `stream`. engine may be null (UNIMPLEMENTED);
// a non-OK `accepting` (warming up, draining) ends the call with it. text
// (the tokenizer; may be null) encodes text prompts and decodes the stream.
// The request and responses travel raw (a GenerateRequest, GenerateResponse
// messages): a body that does not parse, such as text that is not valid
// UTF-8, gets INVALID_ARGUMENT naming the field. Records
// fusedserve_requests_total; on_done (may be empty) runs when gRPC is done
// with the call.
void StartGenerate(Engine* engine, Metrics* metrics, const TextSupport* text, const absl::Status& accepting,
                   absl::Time deadline, const grpc::ByteBuffer& raw_request, GenerateStream* stream,
                   std::function<void()> on_done);

// Generate on the callback API: a GenerateStream that is gRPC's reactor.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewCallbackGenerateStream(GenerateStream** stream);

// A raw request body parsed as `out`; INVALID_ARGUMENT naming the field
// (text that is not valid UTF-8) or the message otherwise.
absl::Status ParseRequest(const grpc::ByteBuffer& raw, const std::string& method, google::protobuf::Message* out);

// Threads that serialize and write Generate messages (--generate_writer_threads;
// 0: the engine thread writes them itself). Set once, before serving.
void SetGenerateWriterThreads(int threads);

// Tokenize and Detokenize (text may be null: FAILED_PRECONDITION). vocab: the
// model's, which bounds the ids Detokenize accepts.
absl::Status Tokenize(const TextSupport* text, const v1::TokenizeRequest& request, v1::TokenizeResponse* response);
// Tokenize on a raw body (see StartGenerate).
absl::Status Tokenize(const TextSupport* text, const grpc::ByteBuffer& raw_request, grpc::ByteBuffer* raw_response);
absl::Status Detokenize(const TextSupport* text, int64_t vocab, const v1::DetokenizeRequest& request,
                        v1::DetokenizeResponse* response);

}  // namespace fusedserve
