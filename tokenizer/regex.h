// The pre-tokenizer's split pattern on PCRE2 (UTF + UCP, JIT-compiled).
// Hugging Face compiles these patterns with Oniguruma; Translate rewrites the
// constructs whose meaning differs in PCRE2 and rejects the ones it cannot
// carry over, so a pattern either means the same or fails to load.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fusedserve::tokenizer {

class Regex {
 public:
  // `field` names the JSON path in errors. `literal`: match the text as is.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal,
                                                        const std::string& field);
  ~Regex();

  // Appends the [begin, end) byte ranges of successive non-overlapping,
  // non-empty matches in `text` (valid UTF-8).
  absl::Status FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

// Oniguruma (Hugging Face) pattern -> PCRE2 pattern with the same meaning,
// or INVALID_ARGUMENT naming `field` and the construct.
absl::StatusOr<std::string> TranslateOnigPattern(std::string_view pattern, const std::string& field);

}  // namespace fusedserve::tokenizer
