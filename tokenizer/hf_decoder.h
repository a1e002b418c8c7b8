// The two ends of tokenizer.json's pipeline that shape ids and text around
// the model: the decoder (how a token's string becomes bytes) and the
// post-processor's template (the ids added around the text, e.g. BOS).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace fusedserve::tokenizer {

// The decoder: how a token's string becomes bytes.
struct DecoderSpec {
  bool byte_level = false;     // ByteLevel
  bool byte_fallback = false;  // ByteFallback: "<0xNN>" is byte NN
  std::string replace_from;    // Replace / Metaspace: "▁" -> " "
  bool strip_leading_space = false;
  bool metaspace = false;  // Metaspace decoder: the first token loses every replacement character
};

// tokenizer.json's "decoder" at `path`.
absl::StatusOr<DecoderSpec> ParseDecoder(const nlohmann::json& j, const std::string& path);

// TemplateProcessing's "single" template: ids before and after the text.
struct Template {
  std::vector<int32_t> prefix, suffix;
};

// tokenizer.json's "post_processor" (null: no template).
absl::Status ParsePostProcessor(const nlohmann::json& j, const std::string& path, Template* t);

}  // namespace fusedserve::tokenizer
