// Interface helpers shared by the tokenizer implementations.
#include "tokenizer/tokenizer.h"

#include "tokenizer/incremental_decoder.h"

namespace fusedserve::tokenizer {

std::string DecodeFromTokenBytes(const Tokenizer& tokenizer, absl::Span<const int32_t> ids, bool skip_special_tokens) {
  IncrementalDecoder decoder(tokenizer, skip_special_tokens);
  std::string out;
  for (int32_t id : ids) out += decoder.Push(id);
  out += decoder.Flush();
  return out;
}

}  // namespace fusedserve::tokenizer
