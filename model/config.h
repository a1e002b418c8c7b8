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

// Caps on the sizes a config.json may declare. They are checked on the config
// alone, before anything that scales with them is allocated (a hostile
// num_hidden_layers = 1e9 once made start-up allocate GBs and abort). Each is
// several times the largest LLaMA-family model published (Llama-3.1-405B: 126
// layers, hidden 16384, intermediate 53248, 128 heads, head_dim 128, vocab
// 128256, 131072 positions), so no real checkpoint comes near them.
inline constexpr int64_t kMaxLayers = 1024;                 // num_hidden_layers
inline constexpr int64_t kMaxHidden = 65536;                // hidden_size
inline constexpr int64_t kMaxIntermediate = 262144;         // intermediate_size
inline constexpr int64_t kMaxHeads = 1024;                  // num_attention_heads, num_key_value_heads
inline constexpr int64_t kMaxHeadDim = 512;                 // head_dim
inline constexpr int64_t kMaxVocab = int64_t{1} << 22;      // vocab_size (4194304)
inline constexpr int64_t kMaxPositions = int64_t{1} << 20;  // max_position_embeddings (1048576)
// Total parameters (~2.2e12, 5x Llama-3.1-405B). Within the caps above the
// count cannot overflow int64 (static_assert in config.cc).
inline constexpr int64_t kMaxParameters = int64_t{1} << 41;
// config.json is a few KB; anything near this is not a config.
inline constexpr int64_t kMaxConfigJsonBytes = int64_t{1} << 20;

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
  // Consistency checks: every size in [1, its kMax* cap], the parameter count
  // at most kMaxParameters, heads divide, even head_dim. Errors name the
  // config.json field and the limit.
  absl::Status Validate() const;
};

// "tiny" (hidden 64, 2 layers, 4 q / 2 kv heads, vocab 512: fast on CPU),
// "llama-3.2-1b", "llama-3-8b" (real layer shapes).
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name);
std::vector<std::string> PresetNames();

// Parses a Hugging Face LlamaForCausalLM config.json (text); `name` labels errors.
absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& json_text, const std::string& name);

// Reads `path` (a regular file of at most kMaxConfigJsonBytes: a FIFO or device
// there is refused, not blocked on) and parses it with ConfigFromHfJson.
// NOT_FOUND when missing; other read errors keep OpenRegularFile's codes.
absl::StatusOr<ModelConfig> ConfigFromHfFile(const std::string& path);

}  // namespace fusedserve
