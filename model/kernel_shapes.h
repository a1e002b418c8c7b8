// The kernel shapes of the model's forward step as tuning-cache keys: what
// the CUDA model runner looks up for each of its launches (at the step's
// token rows, which the cache rounds up to a power-of-two bucket) and what
// the start-up envelope tunes for the hosted model, from one definition, in
// the model's dtype.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "warmup/warmup.h"

namespace fusedserve {

// The runner's tunable launches, per layer unless noted.
enum class ModelKernel {
  kInputNorm,  // rms_norm {T, hidden} (the first layer's; the others are fused into add_rms_norm)
  kAddNorm,    // add_rms_norm {T, hidden}
  kQkv,        // linear {T, (Hq + 2 Hkv) Dh, hidden}
  kOProj,      // linear {T, hidden, Hq Dh}
  kSwiglu,     // swiglu_mlp {T, hidden, I}: the gate path
  kGateUp,     // linear {T, 2 I, hidden}: the gate's GEMM path
  kDown,       // linear {T, hidden, I}
  kAttention,  // attention {T, Hq, Hkv, Dh}: the flash prefill launch
  kLmHead,     // linear {B, vocab, hidden}: once per step, B sequences
};
inline constexpr int kModelKernels = 9;

struct ModelKernelKey {
  std::string op;
  std::vector<int64_t> key;  // the op's TuningKey
};

// The key of kernel k at M rows (token rows; sequences for the LM head).
ModelKernelKey KeyOfModelKernel(const ModelConfig& c, ModelKernel k, int64_t M);

// Every kernel of the model at every bucket 1, 2, 4, ... RoundUpPow2(max_tokens)
// (the LM head up to RoundUpPow2(max_seqs); attention only for the head dims
// the flash kernels take, 64 and 128), in c.dtype. linear comes before
// swiglu_mlp, whose GEMM path reads linear's tuned configs.
std::vector<EnvelopeEntry> ModelEnvelope(const ModelConfig& c, int64_t max_tokens, int64_t max_seqs);

}  // namespace fusedserve
