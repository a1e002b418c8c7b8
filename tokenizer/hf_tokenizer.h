// The Hugging Face tokenizer.json tokenizer (LoadTokenizer in tokenizer.h):
// byte-level BPE with a split regex (Llama-3, Qwen2, GPT-2) and
// SentencePiece-style BPE with byte fallback (Llama-2, Mistral, TinyLlama).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"

namespace fusedserve::tokenizer {

// From the file contents: tokenizer.json, and tokenizer_config.json and
// generation_config.json (empty when absent). `origin` prefixes errors.
absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizer(std::string_view tokenizer_json,
                                                            std::string_view tokenizer_config_json,
                                                            std::string_view generation_config_json,
                                                            const std::string& origin);

}  // namespace fusedserve::tokenizer
