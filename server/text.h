// Text for the model RPCs: the server's tokenizer (the checkpoint's
// tokenizer.json, or the built-in byte tokenizer of the presets), the chat
// format, prompt encoding for Generate and Tokenize, and the streaming text
// of a Generate call (incremental detokenization + stop strings).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fusedserve/v1/fusedserve.pb.h"
#include "tokenizer/incremental_decoder.h"
#include "tokenizer/tokenizer.h"

namespace fusedserve {

// Limits on a request's stop strings.
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopBytes = 256;

class TextSupport {
 public:
  // --model set: <dir>/tokenizer.json when present (its load error is
  // returned: a tokenizer the server cannot reproduce exactly is a config
  // error, and the server must not start); without one, text is unavailable
  // (token ids still work). No --model: the built-in byte tokenizer over the
  // preset's vocabulary.
  static absl::StatusOr<std::unique_ptr<TextSupport>> Load(const std::string& model_dir, int32_t model_vocab);
  // Wraps a tokenizer (tests, tools).
  TextSupport(std::unique_ptr<tokenizer::Tokenizer> tokenizer, std::string source);
  // Text unavailable, for `reason`.
  explicit TextSupport(std::string reason);

  // Null when text is unavailable.
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  // OK, or FAILED_PRECONDITION saying why text is unavailable (`what` names
  // the request field that needs it).
  absl::Status CheckAvailable(const std::string& what) const;
  void FillInfo(v1::TokenizerInfo* info) const;

  // Chat turns -> prompt text in the chat format, ending with the
  // assistant's header (Llama-3: <|begin_of_text|><|start_header_id|>role
  // <|end_header_id|>\n\ncontent<|eot_id|>...). FAILED_PRECONDITION where
  // the checkpoint's format is not supported, naming its template.
  absl::StatusOr<std::string> FormatChat(const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages) const;

  // A prompt given as text (field "prompt"/"text") or chat turns ("messages")
  // -> token ids. Invalid UTF-8 is INVALID_ARGUMENT naming the field and
  // the byte offset.
  absl::StatusOr<std::vector<int32_t>> EncodeText(const std::string& field, std::string_view text,
                                                  bool add_special_tokens) const;
  absl::StatusOr<std::vector<int32_t>> EncodeChat(
      const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages) const;

  // A token's text for Tokenize and logprobs: its bytes as UTF-8, lossily.
  std::string TokenText(int32_t id) const;

 private:
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::string source_;
  std::string unavailable_;   // why there is no tokenizer
  std::string chat_format_;   // "llama-3" or empty
  std::string chat_problem_;  // why messages are refused, when chat_format_ is empty
};

// Offset of the first byte of `s` that is not part of valid UTF-8, or none.
std::optional<size_t> InvalidUtf8Offset(std::string_view s);
// Bytes -> valid UTF-8, each maximal invalid subpart replaced by U+FFFD (as
// Rust's from_utf8_lossy and so Hugging Face's decode).
std::string LossyUtf8(std::string_view s);

// The text side of one Generate stream: the incremental decoder and the stop
// strings. Text that could still start a stop string is held back until it
// cannot; a match ends the stream's text there. Engine thread only.
class TextStream {
 public:
  TextStream(const tokenizer::Tokenizer& tokenizer, bool skip_special_tokens, std::vector<std::string> stops);
  // The text token `id` released; *matched set once a stop string matched
  // (no text after it is returned, ever).
  std::string Push(int32_t id, bool* matched);
  // End of stream: whatever is left (nothing after a match).
  std::string Flush();
  bool matched() const { return matched_; }

 private:
  std::string Release(bool final);

  tokenizer::IncrementalDecoder decoder_;
  std::vector<std::string> stops_;
  std::string held_;
  bool matched_ = false;
};

}  // namespace fusedserve
