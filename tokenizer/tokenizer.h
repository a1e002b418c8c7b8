// Text <-> token ids for Generate: the checkpoint's own tokenizer
// (tokenizer.json + tokenizer_config.json, Hugging Face format), or the
// small built-in byte tokenizer of the embedded presets.
//
// Two implementations behind one interface:
//   hf_tokenizer.cc       byte-level BPE with a split regex (Llama-3, Qwen2,
//                         GPT-2) and SentencePiece-style BPE with byte
//                         fallback (Llama-2, Mistral, TinyLlama); PCRE2 (JIT)
//                         for the pre-tokenizer's Split pattern.
//   builtin_tokenizer.cc  one token per byte plus the special tokens, for
//                         the presets (no files needed).
// Decoding is byte-exact: TokenBytes gives the bytes a token contributes, so
// the streaming decoder (incremental_decoder.h) and Decode agree.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace fusedserve::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // text -> ids. Added/special tokens written in the text are matched first
  // (as Hugging Face does); add_special_tokens adds the post-processor's
  // tokens (BOS). Invalid UTF-8 is INVALID_ARGUMENT naming the byte offset.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const = 0;

  // The bytes token `id` contributes to decoded text when it is not the
  // first token (SentencePiece's leading-space strip is in Decode and the
  // incremental decoder, see strips_leading_space). Special tokens give their
  // content. Out of range: empty.
  virtual std::string TokenBytes(int32_t id) const = 0;

  // ids -> text, equal to Hugging Face's decode(ids, skip_special_tokens)
  // (bytes that are not valid UTF-8 become U+FFFD, as there).
  virtual std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const = 0;

  // The SentencePiece families prepend a space ("▁") to the text before
  // encoding and strip it when decoding: true when the decoded text loses its
  // first character if that is a space (Hugging Face's Fuse + Strip
  // decoders). The Metaspace decoder's rule (every "▁" of the first token)
  // is FirstTokenBytes instead.
  virtual bool strips_leading_space() const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  // A byte-fallback token ("<0xE4>", SentencePiece families with the
  // ByteFallback decoder): a run of them decodes as one UTF-8 string, or, if
  // the run is not valid UTF-8, as one U+FFFD per byte (Hugging Face's
  // ByteFallback decoder), so the streaming decoder holds a run until it ends.
  virtual bool IsByteFallback(int32_t id) const { return false; }
  // The bytes of the first (non-skipped) token of a decode: Hugging Face's
  // Metaspace decoder drops every "▁" of it, not only a leading one.
  virtual std::string FirstTokenBytes(int32_t id) const { return TokenBytes(id); }
  // Token id of a token's content string ("<|eot_id|>", "</s>"), if any.
  virtual std::optional<int32_t> TokenId(std::string_view content) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  // End-of-sequence ids (eos_token, plus <|eot_id|>/<|end_of_text|> where present).
  virtual std::vector<int32_t> eos_ids() const = 0;
  // "byte-level BPE (tokenizer.json)", "sentencepiece BPE (tokenizer.json)", "builtin bytes".
  virtual std::string name() const = 0;
  // tokenizer_config.json's chat_template, empty if none.
  virtual const std::string& chat_template() const = 0;
};

// Decode built on TokenBytes, IsSpecial, IsByteFallback and
// strips_leading_space: what IncrementalDecoder produces for all the ids at
// once. Implementations' Decode use it, so streaming and Decode agree by
// construction.
std::string DecodeFromTokenBytes(const Tokenizer& tokenizer, absl::Span<const int32_t> ids, bool skip_special_tokens);

// Loads <dir>/tokenizer.json (+ tokenizer_config.json when present). Any
// field or component it does not implement is INVALID_ARGUMENT naming the
// field (never a silent difference).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir);

// The embedded presets' tokenizer: ids 0..255 are the bytes; the special
// tokens (<|begin_of_text|>, <|end_of_text|>, <|start_header_id|>,
// <|end_header_id|>, <|eot_id|>) take the next ids. Needs vocab_size >= 261.
absl::StatusOr<std::unique_ptr<Tokenizer>> BuiltinByteTokenizer(int32_t vocab_size);

}  // namespace fusedserve::tokenizer
