// libFuzzer target: the tokenizer on untrusted input, as Generate's prompt
// text and Detokenize's ids reach it. The first byte picks one of four small
// tokenizers (tests/unit/tokenizer_json_fixtures.h and variants: GPT-2 style,
// Llama-3 pattern + NFC + an lstrip/rstrip token, SentencePiece with the
// Prepend normalizer, SentencePiece with Metaspace); the rest is both text
// and a sequence of ids. Properties:
//   - Encode of invalid UTF-8 is INVALID_ARGUMENT; of valid UTF-8 succeeds;
//   - byte-level: Decode(Encode(x)) == x (NFC aside: only on NFC-stable x);
//   - streaming decode of any ids == Decode, in whole characters only.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tests/unit/tokenizer_json_fixtures.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/incremental_decoder.h"
#include "tokenizer/utf8.h"

namespace {

using fusedserve::tokenizer::Tokenizer;
using nlohmann::json;
namespace fx = fusedserve::tokenizer::testing_fixtures;

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::unique_ptr<Tokenizer>> Build() {
  std::vector<json> docs;
  docs.push_back(fx::ByteLevelJson());
  json l3 = fx::ByteLevelJson();
  l3["normalizer"] = {{"type", "NFC"}};
  l3["model"]["ignore_merges"] = true;
  l3["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"use_regex", false}}})}};
  l3["added_tokens"][1]["lstrip"] = true;
  l3["added_tokens"][1]["rstrip"] = true;
  docs.push_back(l3);
  docs.push_back(fx::SentencePieceJson());
  json meta = fx::SentencePieceJson();
  meta["normalizer"] = nullptr;
  meta["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}};
  meta["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "first"}};
  docs.push_back(meta);
  std::vector<std::unique_ptr<Tokenizer>> out;
  for (const json& d : docs) {
    auto t = fusedserve::tokenizer::ParseHfTokenizer(d.dump(), "", "", "fuzz");
    if (!t.ok()) std::abort();
    out.push_back(*std::move(t));
  }
  return out;
}

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::unique_ptr<Tokenizer>> tokenizers = Build();
  if (size == 0) return 0;
  const size_t which = data[0] % tokenizers.size();
  const Tokenizer& tok = *tokenizers[which];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  const bool valid = fusedserve::tokenizer::FirstInvalidUtf8(text) == std::string_view::npos;
  const bool add_special = (data[0] & 4) != 0;
  auto ids = tok.Encode(text, add_special);
  Check(ids.ok() == valid);
  if (!valid) Check(ids.status().code() == absl::StatusCode::kInvalidArgument);
  // Special tokens written in the text decode to their content.
  if (ids.ok() && which == 0 && !add_special) Check(tok.Decode(*ids, /*skip_special_tokens=*/false) == text);

  // The same bytes as ids (2 bytes each, some out of range).
  std::vector<int32_t> raw;
  for (size_t i = 1; i + 1 < size; i += 2) raw.push_back(((data[i] << 8) | data[i + 1]) % (tok.vocab_size() + 8) - 4);
  for (const auto* seq : {&raw, ids.ok() ? &*ids : &raw}) {
    for (bool skip : {false, true}) {
      fusedserve::tokenizer::IncrementalDecoder dec(tok, skip);
      std::string streamed;
      for (int32_t id : *seq) {
        const std::string piece = dec.Push(id);
        Check(fusedserve::tokenizer::FirstInvalidUtf8(piece) == std::string_view::npos);
        streamed += piece;
      }
      streamed += dec.Flush();
      Check(streamed == tok.Decode(*seq, skip));
    }
  }
  return 0;
}
