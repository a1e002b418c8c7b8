// The model's kernel keys (kernel_shapes.h).
#include "model/kernel_shapes.h"

#include <algorithm>

#include "warmup/tuning_cache.h"

namespace fusedserve {

ModelKernelKey KeyOfModelKernel(const ModelConfig& c, ModelKernel k, int64_t M) {
  const int64_t D = c.hidden, I = c.intermediate, qd = c.q_dim(), kvd = c.kv_dim();
  switch (k) {
    case ModelKernel::kInputNorm:
      return {"rms_norm", {M, D}};
    case ModelKernel::kAddNorm:
      return {"add_rms_norm", {M, D}};
    case ModelKernel::kQkv:
      return {"linear", {M, qd + 2 * kvd, D}};
    case ModelKernel::kOProj:
      return {"linear", {M, D, qd}};
    case ModelKernel::kSwiglu:
      return {"swiglu_mlp", {M, D, I}};
    case ModelKernel::kGateUp:
      return {"linear", {M, 2 * I, D}};
    case ModelKernel::kDown:
      return {"linear", {M, D, I}};
    case ModelKernel::kAttention:
      return {"attention", {M, c.q_heads, c.kv_heads, c.head_dim}};
    case ModelKernel::kLmHead:
      return {"linear", {M, c.vocab, D}};
  }
  return {};
}

std::vector<EnvelopeEntry> ModelEnvelope(const ModelConfig& c, int64_t max_tokens, int64_t max_seqs) {
  const int64_t top = RoundUpPow2(std::max<int64_t>(1, max_tokens));
  const int64_t top_seqs = RoundUpPow2(std::max<int64_t>(1, std::min(max_seqs, max_tokens)));
  const bool flash = c.head_dim == 64 || c.head_dim == 128;
  std::vector<EnvelopeEntry> env;
  // Norms, then every linear, then swiglu_mlp and attention (see the header).
  for (ModelKernel k :
       {ModelKernel::kInputNorm, ModelKernel::kAddNorm, ModelKernel::kQkv, ModelKernel::kOProj, ModelKernel::kGateUp,
        ModelKernel::kDown, ModelKernel::kLmHead, ModelKernel::kSwiglu, ModelKernel::kAttention}) {
    if (k == ModelKernel::kAttention && !flash) continue;
    const int64_t last = k == ModelKernel::kLmHead ? top_seqs : top;
    for (int64_t m = 1; m <= last; m *= 2) {
      ModelKernelKey key = KeyOfModelKernel(c, k, m);
      env.push_back({std::move(key.op), c.dtype, std::move(key.key)});
    }
  }
  return env;
}

}  // namespace fusedserve
