// Streaming detokenization for Generate: each pushed token id yields the
// text that became final, never half a UTF-8 character. Concatenating every
// Push and the Flush equals Tokenizer::Decode of all the ids at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace fusedserve::tokenizer {

class IncrementalDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens);

  // Appends one id; returns the text that is now complete (maybe empty).
  std::string Push(int32_t id);
  // End of stream: whatever is held back (an incomplete character becomes
  // U+FFFD, as Decode does).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  // Appends `text` to `out` with the leading-space strip of the first text.
  void Emit(std::string_view text, std::string* out);
  // Ends a run of byte-fallback tokens into `out`.
  void EndByteRun(std::string* out);

  bool first_ = true;        // no text emitted yet (leading-space strip)
  bool first_token_ = true;  // no token taken yet (FirstTokenBytes)
  std::string pending_;      // bytes of an incomplete UTF-8 character
  std::string byte_run_;     // bytes of the current run of byte-fallback tokens
};

}  // namespace fusedserve::tokenizer
