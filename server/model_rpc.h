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
// non-OK `accepting` (warming up, draining) ends the call with it. Records
// fusedserve_requests_total; on_done (may be empty) runs when gRPC is done
// with the call.
grpc::ServerWriteReactor<v1::GenerateResponse>* StartGenerate(Engine* engine, Metrics* metrics,
                                                              const absl::Status& accepting,
                                                              grpc::CallbackServerContext* ctx,
                                                              const v1::GenerateRequest* request,
                                                              std::function<void()> on_done);

}  // namespace fusedserve
