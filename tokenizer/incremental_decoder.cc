// Streaming detokenization. Two hold-backs keep Push's output final:
//  - pending_: the tail of an incomplete UTF-8 character (byte-level BPE
//    splits characters across tokens); decoded as from_utf8_lossy would
//    decode the whole stream, so an invalid byte becomes U+FFFD at once.
//  - byte_run_: a run of byte-fallback tokens, which Hugging Face decodes as
//    a whole (one U+FFFD per byte if the run is invalid anywhere), so it is
//    released only when a non-byte token or Flush ends it.
#include "tokenizer/incremental_decoder.h"

#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer {

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

void IncrementalDecoder::Emit(std::string_view text, std::string* out) {
  if (text.empty()) return;
  if (first_ && tokenizer_.strips_leading_space() && text[0] == ' ') text.remove_prefix(1);
  first_ = false;
  out->append(text);
}

void IncrementalDecoder::EndByteRun(std::string* out) {
  if (byte_run_.empty()) return;
  std::string text;
  if (FirstInvalidUtf8(byte_run_) == std::string_view::npos) {
    text = std::move(byte_run_);
  } else {
    for (size_t i = 0; i < byte_run_.size(); ++i) text.append(kReplacementChar);
  }
  byte_run_.clear();
  Emit(text, out);
}

std::string IncrementalDecoder::Push(int32_t id) {
  std::string out;
  // Hugging Face's decode drops ids it has no token for (before the
  // decoders, so they do not even end a byte-fallback run).
  if (id < 0 || id >= tokenizer_.vocab_size()) return out;
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return out;
  if (tokenizer_.IsByteFallback(id)) {
    // A held incomplete character cannot continue into a byte run (the
    // families that have byte fallback decode pieces as whole strings).
    if (!pending_.empty()) {
      std::string text;
      AppendUtf8Lossy(pending_, /*final=*/true, &text);
      pending_.clear();
      Emit(text, &out);
    }
    byte_run_.append(tokenizer_.TokenBytes(id));
    first_token_ = false;
    return out;
  }
  EndByteRun(&out);
  pending_.append(first_token_ ? tokenizer_.FirstTokenBytes(id) : tokenizer_.TokenBytes(id));
  first_token_ = false;
  std::string text;
  const size_t used = AppendUtf8Lossy(pending_, /*final=*/false, &text);
  pending_.erase(0, used);
  Emit(text, &out);
  return out;
}

std::string IncrementalDecoder::Flush() {
  std::string out;
  EndByteRun(&out);
  if (!pending_.empty()) {
    std::string text;
    AppendUtf8Lossy(pending_, /*final=*/true, &text);
    pending_.clear();
    Emit(text, &out);
  }
  return out;
}

}  // namespace fusedserve::tokenizer
