// Model presets and the Hugging Face config.json parser.
#include "model/config.h"

#include <cmath>
#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "warmup/regular_file.h"

namespace fusedserve {

int64_t ModelConfig::NumParameters() const {
  const int64_t attn = hidden * (q_dim() + 2 * kv_dim()) + q_dim() * hidden;
  const int64_t mlp = 3 * hidden * intermediate;
  const int64_t per_layer = attn + mlp + 2 * hidden;
  return layers * per_layer + vocab * hidden * (tied_embeddings ? 1 : 2) + hidden;
}

std::vector<double> ModelConfig::RopeInvFreq() const {
  const int64_t half = head_dim / 2;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i) inv[i] = std::pow(rope_theta, -2.0 * static_cast<double>(i) / head_dim);
  if (!rope_scaling.enabled) return inv;
  // Llama-3.1: long wavelengths are slowed by `factor`, short ones kept, and
  // the band between interpolated (transformers' _compute_llama3_parameters).
  const RopeScaling& s = rope_scaling;
  const double old_len = static_cast<double>(s.original_max_position);
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f = f / s.factor;
    } else {
      const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv;
}

// Within the per-field caps the parameter count fits int64 with room to spare,
// so NumParameters() cannot overflow once the fields are checked.
constexpr int64_t kMaxQDim = kMaxHeads * kMaxHeadDim;
constexpr int64_t kWorstParametersPerLayer =
    kMaxHidden * 3 * kMaxQDim + kMaxQDim * kMaxHidden + 3 * kMaxHidden * kMaxIntermediate + 2 * kMaxHidden;
static_assert(kWorstParametersPerLayer < INT64_MAX / 4 / kMaxLayers && kMaxVocab < INT64_MAX / 4 / kMaxHidden,
              "the size caps must keep NumParameters() far from int64 overflow");

absl::Status ModelConfig::Validate() const {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("model config '", name, "': ", what));
  };
  struct Size {
    const char* field;  // the config.json key
    int64_t value;
    int64_t max;
  };
  for (const Size& s :
       {Size{"num_hidden_layers", layers, kMaxLayers}, Size{"hidden_size", hidden, kMaxHidden},
        Size{"intermediate_size", intermediate, kMaxIntermediate}, Size{"num_attention_heads", q_heads, kMaxHeads},
        Size{"num_key_value_heads", kv_heads, kMaxHeads}, Size{"head_dim", head_dim, kMaxHeadDim},
        Size{"vocab_size", vocab, kMaxVocab}, Size{"max_position_embeddings", max_position, kMaxPositions}}) {
    if (s.value <= 0) return bad(absl::StrCat(s.field, " must be positive (got ", s.value, ")"));
    if (s.value > s.max) return bad(absl::StrCat(s.field, " = ", s.value, " exceeds the limit of ", s.max));
  }
  if (q_heads % kv_heads != 0) {
    return bad(
        absl::StrCat("num_attention_heads (", q_heads, ") must be a multiple of num_key_value_heads (", kv_heads, ")"));
  }
  if (head_dim % 2 != 0) return bad(absl::StrCat("head_dim must be even for rope (got ", head_dim, ")"));
  if (!(rms_eps > 0) || !std::isfinite(rms_eps)) return bad("rms_norm_eps must be positive and finite");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) return bad("rope_theta must be positive and finite");
  if (rope_scaling.enabled) {
    const RopeScaling& r = rope_scaling;
    if (!(r.factor > 0) || !std::isfinite(r.factor) || !(r.low_freq_factor > 0) ||
        !(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
      return bad("rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor > 0");
    }
    if (r.original_max_position <= 0 || r.original_max_position > kMaxPositions) {
      return bad(absl::StrCat("rope_scaling.original_max_position_embeddings = ", r.original_max_position,
                              " is outside [1, ", kMaxPositions, "]"));
    }
  }
  if (const int64_t n = NumParameters(); n > kMaxParameters) {
    return bad(absl::StrCat("these sizes make ", n, " parameters, more than the limit of ", kMaxParameters));
  }
  return absl::OkStatus();
}

std::vector<std::string> PresetNames() { return {"tiny", "llama-3.2-1b", "llama-3-8b"}; }

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name) {
  ModelConfig c;
  c.name = name;
  if (name == "tiny") {
    // Small enough that a CPU decode step takes well under a millisecond.
    c.hidden = 64;
    c.layers = 2;
    c.q_heads = 4;
    c.kv_heads = 2;
    c.head_dim = 16;
    c.intermediate = 176;
    c.vocab = 512;
    c.max_position = 8192;
    c.dtype = DType::kF32;
  } else if (name == "llama-3.2-1b") {
    c.hidden = 2048;
    c.layers = 16;
    c.q_heads = 32;
    c.kv_heads = 8;
    c.head_dim = 64;
    c.intermediate = 8192;
    c.vocab = 128256;
    c.max_position = 131072;
    c.tied_embeddings = true;
    c.rope_scaling = {true, 32.0, 1.0, 4.0, 8192};
  } else if (name == "llama-3-8b") {
    c.hidden = 4096;
    c.layers = 32;
    c.q_heads = 32;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.intermediate = 14336;
    c.vocab = 128256;
    c.max_position = 8192;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --model_preset '", name, "' (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

namespace {

using nlohmann::json;

absl::StatusOr<DType> DTypeFromTorchName(const std::string& s, const std::string& name) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  if (s == "float32") return DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": unsupported torch_dtype '", s, "' (bfloat16, float16 or float32)"));
}

// An integer field; `fallback` when absent or null (no fallback: required).
// Values beyond int64 saturate, so that Validate reports them against their cap.
absl::StatusOr<int64_t> IntField(const json& j, const char* key, std::optional<int64_t> fallback,
                                 const std::string& name) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat(name, ": missing integer '", key, "'"));
  }
  if (!it->is_number_integer())
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", key, "' must be an integer"));
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return INT64_MAX;
  return it->get<int64_t>();
}

}  // namespace

absl::StatusOr<ModelConfig> ConfigFromHfJson(const std::string& json_text, const std::string& name) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  }
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat(name, ": ", what)); };
  try {
    if (j.contains("model_type") && j["model_type"].get<std::string>() != "llama") {
      return bad(absl::StrCat("model_type '", j["model_type"].get<std::string>(),
                              "' is not supported (only 'llama', LlamaForCausalLM)"));
    }
    if (j.value("hidden_act", std::string("silu")) != "silu") {
      return bad(absl::StrCat("hidden_act '", j["hidden_act"].get<std::string>(), "' is not supported (silu)"));
    }
    if (j.value("attention_bias", false)) return bad("attention_bias=true is not supported");
    if (j.value("mlp_bias", false)) return bad("mlp_bias=true is not supported");
    ModelConfig c;
    c.name = name;
    struct Field {
      const char* key;
      int64_t* out;
    };
    for (const Field& f : {Field{"hidden_size", &c.hidden}, Field{"num_hidden_layers", &c.layers},
                           Field{"num_attention_heads", &c.q_heads}, Field{"intermediate_size", &c.intermediate},
                           Field{"vocab_size", &c.vocab}}) {
      absl::StatusOr<int64_t> v = IntField(j, f.key, std::nullopt, name);
      if (!v.ok()) return v.status();
      *f.out = *v;
    }
    absl::StatusOr<int64_t> kv_heads = IntField(j, "num_key_value_heads", c.q_heads, name);
    if (!kv_heads.ok()) return kv_heads.status();
    c.kv_heads = *kv_heads;
    absl::StatusOr<int64_t> head_dim = IntField(j, "head_dim", c.q_heads > 0 ? c.hidden / c.q_heads : 0, name);
    if (!head_dim.ok()) return head_dim.status();
    c.head_dim = *head_dim;
    absl::StatusOr<int64_t> max_position = IntField(j, "max_position_embeddings", int64_t{8192}, name);
    if (!max_position.ok()) return max_position.status();
    c.max_position = *max_position;
    c.rms_eps = j.value("rms_norm_eps", 1e-6);
    c.tied_embeddings = j.value("tie_word_embeddings", false);
    // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
    const char* dtype_key = j.contains("dtype") && j["dtype"].is_string() ? "dtype" : "torch_dtype";
    c.dtype = DType::kF32;
    if (j.contains(dtype_key) && j[dtype_key].is_string()) {
      absl::StatusOr<DType> d = DTypeFromTorchName(j[dtype_key].get<std::string>(), name);
      if (!d.ok()) return d.status();
      c.dtype = *d;
    }
    // Rope parameters: "rope_theta" + "rope_scaling" (transformers 4.x) or
    // "rope_parameters" (5.x).
    json rope = json::object();
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rope = j["rope_scaling"];
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) rope = j["rope_parameters"];
    c.rope_theta = j.value("rope_theta", rope.value("rope_theta", 10000.0));
    const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (rope_type == "llama3") {
      c.rope_scaling.enabled = true;
      c.rope_scaling.factor = rope.value("factor", 8.0);
      c.rope_scaling.low_freq_factor = rope.value("low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = rope.value("high_freq_factor", 4.0);
      absl::StatusOr<int64_t> original = IntField(rope, "original_max_position_embeddings", int64_t{8192}, name);
      if (!original.ok()) return original.status();
      c.rope_scaling.original_max_position = *original;
    } else if (rope_type != "default") {
      return bad(absl::StrCat("rope type '", rope_type, "' is not supported (default or llama3)"));
    }
    if (absl::Status s = c.Validate(); !s.ok()) return s;
    return c;
  } catch (const json::exception& e) {
    return bad(absl::StrCat("config.json has a field of the wrong type: ", e.what()));
  }
}

absl::StatusOr<ModelConfig> ConfigFromHfFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxConfigJsonBytes);
  if (!text.ok()) return text.status();
  return ConfigFromHfJson(*text, path);
}

}  // namespace fusedserve
