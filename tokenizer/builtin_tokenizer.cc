// The embedded presets' tokenizer (see tokenizer.h): one token per byte, the
// Llama-3 special tokens next, and the rest of the vocabulary reserved
// special tokens named as Llama-3 names them. No files, no merges: a
// stand-in so random-weight presets speak text through the same paths as a
// real checkpoint (chat format, stop strings, streaming decode).
#include <array>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer {
namespace {

constexpr int32_t kFirstSpecial = 256;
constexpr std::array<std::string_view, 5> kSpecials = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                                       "<|end_header_id|>", "<|eot_id|>"};
constexpr int32_t kFirstReserved = kFirstSpecial + static_cast<int32_t>(kSpecials.size());
constexpr std::string_view kReservedPrefix = "<|reserved_special_token_";
constexpr std::string_view kReservedSuffix = "|>";

class BuiltinTokenizer final : public Tokenizer {
 public:
  explicit BuiltinTokenizer(int32_t vocab) : vocab_(vocab) {}

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override {
    if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("text is not valid UTF-8 (byte offset ", bad, ": 0x",
                       absl::Hex(static_cast<unsigned>(static_cast<unsigned char>(text[bad])), absl::kZeroPad2), ")"));
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() + 1);
    if (add_special_tokens) ids.push_back(kFirstSpecial);  // <|begin_of_text|>
    size_t i = 0;
    while (i < text.size()) {
      if (text[i] == '<' && i + 1 < text.size() && text[i + 1] == '|') {
        if (std::optional<std::pair<int32_t, size_t>> m = MatchSpecial(text.substr(i)); m.has_value()) {
          ids.push_back(m->first);
          i += m->second;
          continue;
        }
      }
      ids.push_back(static_cast<unsigned char>(text[i]));
      ++i;
    }
    return ids;
  }

  std::string TokenBytes(int32_t id) const override {
    if (id < 0 || id >= vocab_) return "";
    if (id < kFirstSpecial) return std::string(1, static_cast<char>(id));
    if (id < kFirstReserved) return std::string(kSpecials[id - kFirstSpecial]);
    return std::string(kReservedPrefix) + std::to_string(id - kFirstReserved) + std::string(kReservedSuffix);
  }

  // Byte-exact like the checkpoint tokenizers: the streaming decoder's result.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override {
    return DecodeFromTokenBytes(*this, ids, skip_special_tokens);
  }

  bool strips_leading_space() const override { return false; }
  bool IsSpecial(int32_t id) const override { return id >= kFirstSpecial && id < vocab_; }

  std::optional<int32_t> TokenId(std::string_view content) const override {
    if (content.size() == 1) return static_cast<unsigned char>(content[0]);
    std::optional<std::pair<int32_t, size_t>> m = MatchSpecial(content);
    if (m.has_value() && m->second == content.size()) return m->first;
    return std::nullopt;
  }

  int32_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> bos_id() const override { return kFirstSpecial; }
  std::vector<int32_t> eos_ids() const override { return {kFirstSpecial + 1, kFirstSpecial + 4}; }
  std::string name() const override { return "builtin bytes"; }
  const std::string& chat_template() const override { return chat_template_; }

 private:
  // The special token that `s` starts with: its id and length.
  std::optional<std::pair<int32_t, size_t>> MatchSpecial(std::string_view s) const {
    for (size_t k = 0; k < kSpecials.size(); ++k) {
      if (s.substr(0, kSpecials[k].size()) == kSpecials[k]) {
        return std::make_pair(kFirstSpecial + static_cast<int32_t>(k), kSpecials[k].size());
      }
    }
    if (s.substr(0, kReservedPrefix.size()) != kReservedPrefix) return std::nullopt;
    const std::string_view rest = s.substr(kReservedPrefix.size());
    size_t digits = 0;
    while (digits < rest.size() && digits < 7 && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
    if (digits == 0 || (digits > 1 && rest[0] == '0')) return std::nullopt;
    if (rest.substr(digits, kReservedSuffix.size()) != kReservedSuffix) return std::nullopt;
    int64_t n = 0;
    std::from_chars(rest.data(), rest.data() + digits, n);
    if (n >= vocab_ - kFirstReserved) return std::nullopt;
    return std::make_pair(kFirstReserved + static_cast<int32_t>(n),
                          kReservedPrefix.size() + digits + kReservedSuffix.size());
  }

  const int32_t vocab_;
  const std::string chat_template_;  // none: the Llama-3 format is found from the special tokens
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> BuiltinByteTokenizer(int32_t vocab_size) {
  if (vocab_size < kFirstReserved) {
    return absl::InvalidArgumentError(
        absl::StrCat("the built-in byte tokenizer needs a vocabulary of at least ", kFirstReserved,
                     " tokens (256 bytes + 5 special tokens); the model has ", vocab_size));
  }
  return std::unique_ptr<Tokenizer>(new BuiltinTokenizer(vocab_size));
}

}  // namespace fusedserve::tokenizer
