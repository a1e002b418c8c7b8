// The server's tokenizer, chat format and streaming text (see text.h).
#include "server/text.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/utf8.h"

namespace fusedserve {
namespace {

// Names the chat template a checkpoint ships, for the error that refuses it.
std::string DescribeTemplate(const std::string& t) {
  if (absl::StrContains(t, "<|im_start|>")) return "a ChatML template (<|im_start|>, Qwen2 style)";
  if (absl::StrContains(t, "[INST]")) return "an [INST] template (Llama-2 / Mistral style)";
  if (absl::StrContains(t, "<|user|>")) return "a <|user|> template (Zephyr / TinyLlama style)";
  if (absl::StrContains(t, "<start_of_turn>")) return "a <start_of_turn> template (Gemma style)";
  std::string head = t.substr(0, 60);
  for (char& ch : head) {
    if (ch == '\n') ch = ' ';
  }
  return absl::StrCat("the template \"", LossyUtf8(head), t.size() > 60 ? "...\"" : "\"");
}

}  // namespace

std::optional<size_t> InvalidUtf8Offset(std::string_view s) {
  const size_t bad = tokenizer::FirstInvalidUtf8(s);
  if (bad == std::string_view::npos) return std::nullopt;
  return bad;
}

std::string LossyUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  tokenizer::AppendUtf8Lossy(s, /*final=*/true, &out);
  return out;
}

TextSupport::TextSupport(std::unique_ptr<tokenizer::Tokenizer> tokenizer, std::string source)
    : tokenizer_(std::move(tokenizer)), source_(std::move(source)) {
  const tokenizer::Tokenizer& t = *tokenizer_;
  // Llama-3's chat format is recognised by its header tokens, unless the
  // checkpoint's own template does not use them (a fine-tune with another
  // format keeps the tokens): then that template is what the model expects.
  const bool headers = t.TokenId("<|start_header_id|>") && t.TokenId("<|end_header_id|>") && t.TokenId("<|eot_id|>");
  if (headers && (t.chat_template().empty() || absl::StrContains(t.chat_template(), "<|start_header_id|>"))) {
    chat_format_ = "llama-3";
  } else if (!t.chat_template().empty()) {
    chat_problem_ = absl::StrCat(
        "the checkpoint's chat template (tokenizer_config.json chat_template) is ", DescribeTemplate(t.chat_template()),
        ", which this server cannot run: it formats chat natively only in the Llama-3 format (header tokens), and "
        "no C++ Jinja template engine is available to it; format the prompt yourself and send it as prompt");
  } else {
    chat_problem_ =
        "the tokenizer has no chat format (no Llama-3 header tokens, no chat_template in tokenizer_config.json); "
        "send the prompt as text instead";
  }
}

TextSupport::TextSupport(std::string reason) : unavailable_(std::move(reason)) {}

absl::StatusOr<std::unique_ptr<TextSupport>> TextSupport::Load(const std::string& model_dir, int32_t model_vocab) {
  if (model_dir.empty()) {
    absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::BuiltinByteTokenizer(model_vocab);
    if (!t.ok()) return std::make_unique<TextSupport>(absl::StrCat("no tokenizer: ", t.status().message()));
    return std::make_unique<TextSupport>(*std::move(t), "builtin");
  }
  const std::filesystem::path file = std::filesystem::path(model_dir) / "tokenizer.json";
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    return std::make_unique<TextSupport>(
        absl::StrCat("the checkpoint has no tokenizer: ", file.string(),
                     " is missing (text prompts, stop strings and Tokenize need it; token ids still work)"));
  }
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::LoadTokenizer(model_dir);
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(file.string(), ": ", t.status().message()));
  }
  return std::make_unique<TextSupport>(*std::move(t), file.string());
}

absl::Status TextSupport::CheckAvailable(const std::string& what) const {
  if (tokenizer_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", unavailable_));
}

void TextSupport::FillInfo(v1::TokenizerInfo* info) const {
  if (tokenizer_ == nullptr) {
    info->set_unavailable_reason(unavailable_);
    info->set_bos_token_id(-1);
    return;
  }
  info->set_name(tokenizer_->name());
  info->set_source(source_);
  info->set_vocab_size(tokenizer_->vocab_size());
  info->set_bos_token_id(tokenizer_->bos_id().value_or(-1));
  for (int32_t id : tokenizer_->eos_ids()) info->add_eos_token_ids(id);
  info->set_chat_supported(!chat_format_.empty());
  info->set_chat_format(chat_format_);
}

absl::StatusOr<std::string> TextSupport::FormatChat(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages) const {
  if (absl::Status s = CheckAvailable("messages"); !s.ok()) return s;
  if (chat_format_.empty()) return absl::FailedPreconditionError(absl::StrCat("messages: ", chat_problem_));
  for (int i = 0; i < messages.size(); ++i) {
    const v1::ChatMessage& m = messages[i];
    if (m.role().empty() || m.role().size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role: must be 1 to 64 bytes (\"system\", \"user\", \"assistant\", ...)"));
    }
    // A role is a name, not markup: header tokens or newlines in it would
    // forge turns.
    if (absl::StrContains(m.role(), "<|") || absl::StrContains(m.role(), "\n")) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role: must not contain \"<|\" or a newline"));
    }
    for (const auto& [field, text] : {std::pair<const char*, const std::string*>{"role", &m.role()},
                                      std::pair<const char*, const std::string*>{"content", &m.content()}}) {
      if (std::optional<size_t> bad = InvalidUtf8Offset(*text); bad.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages[", i, "].", field, ": not valid UTF-8 (byte offset ", *bad, ")"));
      }
    }
  }
  // Llama-3 (as its tokenizer_config.json template): BOS, then each turn
  // with its content stripped, then the assistant's header.
  std::string out;
  if (std::optional<int32_t> bos = tokenizer_->bos_id(); bos.has_value()) out += tokenizer_->TokenBytes(*bos);
  for (const v1::ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", m.role(), "<|end_header_id|>\n\n",
                    absl::StripAsciiWhitespace(m.content()), "<|eot_id|>");
  }
  out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

absl::StatusOr<std::vector<int32_t>> TextSupport::EncodeText(const std::string& field, std::string_view text,
                                                             bool add_special_tokens) const {
  if (absl::Status s = CheckAvailable(field); !s.ok()) return s;
  if (std::optional<size_t> bad = InvalidUtf8Offset(text); bad.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not valid UTF-8 (byte offset ", *bad, ": 0x",
                     absl::Hex(static_cast<unsigned>(static_cast<unsigned char>(text[*bad])), absl::kZeroPad2), ")"));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text, add_special_tokens);
  if (!ids.ok()) return absl::Status(ids.status().code(), absl::StrCat(field, ": ", ids.status().message()));
  return ids;
}

absl::StatusOr<std::vector<int32_t>> TextSupport::EncodeChat(
    const google::protobuf::RepeatedPtrField<v1::ChatMessage>& messages) const {
  absl::StatusOr<std::string> text = FormatChat(messages);
  if (!text.ok()) return text.status();
  // The format writes its own BOS.
  return EncodeText("messages", *text, /*add_special_tokens=*/false);
}

std::string TextSupport::TokenText(int32_t id) const {
  return tokenizer_ == nullptr ? std::string() : LossyUtf8(tokenizer_->TokenBytes(id));
}

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, bool skip_special_tokens, std::vector<std::string> stops)
    : decoder_(tokenizer, skip_special_tokens), stops_(std::move(stops)) {}

std::string TextStream::Push(int32_t id, bool* matched) {
  if (matched_) {
    *matched = true;
    return "";
  }
  held_ += decoder_.Push(id);
  std::string out = Release(/*final=*/false);
  *matched = matched_;
  return out;
}

std::string TextStream::Flush() {
  if (matched_) return "";
  held_ += decoder_.Flush();
  return Release(/*final=*/true);
}

std::string TextStream::Release(bool final) {
  if (stops_.empty()) return std::exchange(held_, std::string());
  // Earliest match of any stop string in the held text; the text before it
  // is the last this stream returns. (Returned text never holds the start
  // of a match: see below.)
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  if (final) return std::exchange(held_, std::string());
  // Keep the longest suffix that is a proper prefix of some stop string: it
  // may complete into a match with the next token's text.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(held_.size(), s.size() - 1); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace fusedserve
