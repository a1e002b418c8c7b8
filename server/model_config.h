// Shape of the hosted LLaMA-3-architecture model: built-in presets (random
// weights, for tests and benchmarks) or a Hugging Face config.json. Only what
// the forward pass needs; unsupported variants (biases, other activations,
// other rope types) are rejected at start-up rather than computed wrongly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace fusedserve {

// Llama-3.1 frequency-dependent rope scaling ("rope_type": "llama3").
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  std::string name;  // preset name or checkpoint directory
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;
  int64_t max_position = 8192;  // max_position_embeddings
  double rms_eps = 1e-5;
  double rope_theta = 500000.0;
  RopeScaling rope_scaling;
  bool tied_embeddings = false;
  DType dtype = DType::kBF16;  // weight dtype (checkpoint's, or the preset's)

  int64_t q_dim() const { return q_heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  // Parameter count (embeddings counted once when tied).
  int64_t NumParameters() const;
  // Inverse rope frequencies [head_dim / 2], scaling applied.
  std::vector<double> RopeInvFreq() const;
  // Consistency checks (positive sizes, heads divide, even head_dim).
  absl::Status Validate() const;
};

// "tiny" (hidden 64, 2 layers, 4 q / 2 kv heads, vocab 512: fast on CPU),
// "llama-3.2-1b", "llama-3-8b" (real layer shapes).
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

// Parses a Hugging Face LlamaForCausalLM config.json (text); `name` labels errors.
absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& json_text, const std::string& name);

}  // namespace fusedserve
