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
void StartTransformerBlock(Engine* engine, grpc::CallbackServerContext* ctx, const v1::TransformerBlockRequest* request,
                           v1::TransformerBlockResponse* response, const ValidationLimits& limits,
                           std::function<void(const absl::Status&)> finish);

// The reactor of one Generate call. engine may be null (UNIMPLEMENTED); a
// non-OK `accepting` (warming up, draining) ends the call with it. text (the
// tokenizer; may be null) encodes text prompts and decodes the stream.
// The request and responses travel raw (a GenerateRequest, GenerateResponse
// messages): a body that does not parse, such as text that is not valid
// UTF-8, gets INVALID_ARGUMENT naming the field. Records
// fusedserve_requests_total; on_done (may be empty) runs when gRPC is done
// with the call.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartGenerate(Engine* engine, Metrics* metrics, const TextSupport* text,
                                                          const absl::Status& accepting,
                                                          grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* raw_request,
                                                          std::function<void()> on_done);

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
