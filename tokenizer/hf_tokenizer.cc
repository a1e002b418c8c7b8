// tokenizer.json (+ tokenizer_config.json, generation_config.json) -> the
// Tokenizer: parsing, with every component checked against what is
// implemented, and the encode pipeline (added tokens, normalizer,
// pre-tokenizer, BPE, template).
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/hf_decoder.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/sv.h"
#include "tokenizer/utf8.h"
#include "warmup/regular_file.h"

namespace fusedserve::tokenizer {
namespace {

using nlohmann::json;

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // "▁"
constexpr int64_t kMaxTokenizerFileBytes = int64_t{512} << 20;

// j[key] without a copy; null when absent.
const json& Field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

absl::Status Invalid(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", SV(what)));
}

// A byte-level vocabulary string -> the bytes it spells, or nullopt when it
// holds a character outside the alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const int b = CharToByte(NextCodePoint(s, &i));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

// "<0xNN>" (Hugging Face's ByteFallback decoder test) -> the byte.
std::optional<uint8_t> ByteFallbackByte(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

std::string ReplaceAllStr(std::string_view in, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = in.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(in.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(in.substr(pos));
  return out;
}

// The decoder: how a token's string becomes bytes.
// tokenizer_config.json's "bos_token"/"eos_token": a string or {"content": ...}.
std::optional<std::string> ConfigToken(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

class HfTokenizer : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const override;
  std::string TokenBytes(int32_t id) const override {
    return id >= 0 && id < static_cast<int32_t>(token_bytes_.size()) ? token_bytes_[id] : std::string();
  }
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override {
    return DecodeFromTokenBytes(*this, ids, skip_special_tokens);
  }
  std::string FirstTokenBytes(int32_t id) const override {
    if (!decoder_.metaspace || id < 0 || id >= static_cast<int32_t>(first_bytes_.size())) return TokenBytes(id);
    return first_bytes_[id];
  }
  bool strips_leading_space() const override { return decoder_.strip_leading_space; }
  bool IsSpecial(int32_t id) const override { return Flag(id, kSpecial); }
  bool IsByteFallback(int32_t id) const override { return Flag(id, kByteFallback); }
  std::optional<int32_t> TokenId(std::string_view content) const override {
    auto it = token_ids_.find(SV(content));
    if (it == token_ids_.end()) return std::nullopt;
    return it->second;
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::vector<int32_t> eos_ids() const override { return eos_; }
  std::string name() const override {
    return decoder_.byte_level ? "byte-level BPE (tokenizer.json)" : "sentencepiece BPE (tokenizer.json)";
  }
  const std::string& chat_template() const override { return chat_template_; }

  absl::Status Load(const json& tok, const json& config, const json& generation, const std::string& origin);

 private:
  enum : uint8_t { kSpecial = 1, kByteFallback = 2 };
  bool Flag(int32_t id, uint8_t f) const {
    return id >= 0 && id < static_cast<int32_t>(flags_.size()) && (flags_[id] & f) != 0;
  }
  absl::Status LoadModel(const json& model, const std::string& path);
  absl::Status LoadAddedTokens(const json& added, const std::string& path);
  void SetTokenString(int32_t id, const std::string& s);
  absl::Status EncodeSegment(std::string_view text, bool at_origin, std::vector<int32_t>* ids) const;

  std::unique_ptr<BpeModel> bpe_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  DecoderSpec decoder_;
  Template template_;
  std::deque<AddedToken> added_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<std::string> token_bytes_;
  std::vector<std::string> first_bytes_;  // Metaspace decoder: FirstTokenBytes
  std::vector<uint8_t> flags_;
  absl::flat_hash_map<std::string, int32_t> token_ids_;
  size_t model_vocab_count_ = 0;
  std::optional<int32_t> bos_;
  std::vector<int32_t> eos_;
  std::string chat_template_;
};

void HfTokenizer::SetTokenString(int32_t id, const std::string& s) {
  if (id >= static_cast<int32_t>(token_bytes_.size())) {
    token_bytes_.resize(id + 1);
    flags_.resize(id + 1, 0);
  }
  token_ids_[s] = id;
  flags_[id] &= ~kByteFallback;
  if (decoder_.byte_level) {
    // The ByteLevel decoder spells out a token whose characters are all in
    // the alphabet, else keeps its UTF-8 as is.
    auto bytes = ByteLevelToBytes(s);
    token_bytes_[id] = bytes ? *std::move(bytes) : s;
    return;
  }
  if (auto b = ByteFallbackByte(s); b && decoder_.byte_fallback) {
    token_bytes_[id] = std::string(1, static_cast<char>(*b));
    flags_[id] |= kByteFallback;
    return;
  }
  token_bytes_[id] = ReplaceAllStr(s, decoder_.replace_from, " ");
  if (decoder_.metaspace) {
    if (id >= static_cast<int32_t>(first_bytes_.size())) first_bytes_.resize(id + 1);
    first_bytes_[id] = ReplaceAllStr(s, decoder_.replace_from, "");
  }
}

absl::Status HfTokenizer::LoadModel(const json& m, const std::string& path) {
  if (!m.is_object()) return Invalid(path, "expected an object");
  if (m.contains("type")) {
    auto type = JsonString(m, "type", path);
    if (!type.ok()) return type.status();
    if (*type != "BPE") return Invalid(path + ".type", absl::StrCat("model '", *type, "' is not supported (BPE only)"));
  }
  if (auto st = RejectUnknownKeys(m,
                                  {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                   "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"},
                                  path);
      !st.ok()) {
    return st;
  }
  if (m.contains("dropout") && !m["dropout"].is_null() && !(m["dropout"].is_number() && m["dropout"] == 0)) {
    return Invalid(path + ".dropout", "BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty())) {
      return Invalid(absl::StrCat(path, ".", key), "is not supported");
    }
  }
  BpeOptions opt;
  opt.byte_level = decoder_.byte_level;
  auto bf = JsonBool(m, "byte_fallback", false, path);
  auto fuse = JsonBool(m, "fuse_unk", false, path);
  auto ignore = JsonBool(m, "ignore_merges", false, path);
  if (!bf.ok()) return bf.status();
  if (!fuse.ok()) return fuse.status();
  if (!ignore.ok()) return ignore.status();
  opt.byte_fallback = *bf;
  opt.fuse_unk = *fuse;
  opt.ignore_merges = *ignore;
  if (opt.byte_fallback && opt.byte_level) return Invalid(path + ".byte_fallback", "not supported with byte-level BPE");
  const json& vocab = Field(m, "vocab");
  if (!vocab.is_object()) return Invalid(path + ".vocab", "expected an object");
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    if (!m["unk_token"].is_string()) return Invalid(path + ".unk_token", "expected a string");
    auto it = vocab.find(m["unk_token"].get<std::string>());
    if (it == vocab.end()) return Invalid(path + ".unk_token", "is not in the vocabulary");
    opt.unk_id = it->get<int32_t>();
  }
  bpe_ = std::make_unique<BpeModel>(opt);
  model_vocab_count_ = vocab.size();
  const json& merges = Field(m, "merges");
  bpe_->Reserve(vocab.size(), merges.is_array() ? merges.size() : 0);
  token_bytes_.reserve(vocab.size() + 1024);
  token_ids_.reserve(vocab.size() + 1024);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (int64_t{1} << 30)) {
      return Invalid(path + ".vocab", absl::StrCat("token '", it.key(), "' has no valid id"));
    }
    const int32_t id = it->get<int32_t>();
    SetTokenString(id, it.key());
    if (FirstInvalidUtf8(it.key()) != std::string_view::npos) return Invalid(path + ".vocab", "token is not UTF-8");
    if (opt.byte_level) {
      // Tokens outside the byte-level alphabet can never be reached by BPE.
      if (auto bytes = ByteLevelToBytes(it.key())) bpe_->AddToken(*std::move(bytes), id);
    } else {
      bpe_->AddToken(it.key(), id);
    }
  }
  if (!merges.is_array()) return Invalid(path + ".merges", "expected an array");
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& mj = merges[i];
    std::string left, right;
    if (mj.is_string()) {  // "a b"
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return Invalid(absl::StrCat(path, ".merges[", i, "]"), "expected \"left right\"");
      }
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      left = mj[0].get<std::string>();
      right = mj[1].get<std::string>();
    } else {
      return Invalid(absl::StrCat(path, ".merges[", i, "]"), "expected \"left right\" or [left, right]");
    }
    if (opt.byte_level) {
      auto l = ByteLevelToBytes(left), r = ByteLevelToBytes(right);
      if (!l || !r) continue;  // unreachable by byte-level BPE
      left = *std::move(l);
      right = *std::move(r);
    }
    if (!bpe_->AddMerge(left, right, static_cast<int32_t>(i))) {
      return Invalid(absl::StrCat(path, ".merges[", i, "]"), "a part or the merged token is not in the vocabulary");
    }
  }
  bpe_->Finalize();
  return absl::OkStatus();
}

absl::Status HfTokenizer::LoadAddedTokens(const json& added, const std::string& path) {
  if (added.is_null()) return absl::OkStatus();
  if (!added.is_array()) return Invalid(path, "expected an array");
  // Hugging Face gives an added token the id of its content in the
  // vocabulary, else the next free id (the JSON ids only warn when they
  // differ): a file whose ids disagree would encode differently, so it is refused.
  const int32_t model_size = static_cast<int32_t>(model_vocab_count_);
  int32_t max_added = -1;
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    const std::string p = absl::StrCat(path, "[", i, "]");
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() > (int64_t{1} << 30)) {
      return Invalid(p, "expected an object with an id");
    }
    if (auto st =
            RejectUnknownKeys(a, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}, p);
        !st.ok()) {
      return st;
    }
    AddedToken t;
    auto content = JsonString(a, "content", p);
    if (!content.ok()) return content.status();
    t.content = *content;
    t.id = a["id"].get<int32_t>();
    auto special = JsonBool(a, "special", false, p);
    auto lstrip = JsonBool(a, "lstrip", false, p);
    auto rstrip = JsonBool(a, "rstrip", false, p);
    auto single = JsonBool(a, "single_word", false, p);
    auto normalized = JsonBool(a, "normalized", !special.value_or(false), p);
    for (const auto* b : {&special, &lstrip, &rstrip, &single, &normalized}) {
      if (!b->ok()) return b->status();
    }
    if (t.content.empty() || FirstInvalidUtf8(t.content) != std::string_view::npos) {
      return Invalid(p + ".content", "must be non-empty UTF-8");
    }
    if (*single) return Invalid(p + ".single_word", "true is not supported");
    t.special = *special;
    t.lstrip = *lstrip;
    t.rstrip = *rstrip;
    t.normalized = *normalized;
    if (t.normalized && !normalizer_.empty()) {
      return Invalid(p + ".normalized", "true is not supported together with a normalizer");
    }
    const std::optional<int32_t> known = TokenId(t.content);
    const int32_t expected = known ? *known
                                   : (max_added < 0             ? model_size
                                      : max_added >= model_size ? max_added + 1
                                                                : model_size);
    if (t.id != expected) {
      return Invalid(p + ".id", absl::StrCat("is ", t.id, " but Hugging Face would assign ", expected,
                                             " (the vocabulary's id of the content, else the next free id)"));
    }
    max_added = std::max(max_added, t.id);
    if (known && IsSpecial(t.id) == t.special &&
        std::any_of(added_.begin(), added_.end(), [&](const AddedToken& a) { return a.content == t.content; })) {
      continue;  // listed twice
    }
    SetTokenString(t.id, t.content);
    if (t.special) flags_[t.id] |= kSpecial;
    added_.push_back(std::move(t));
    (added_.back().normalized ? normalized_matcher_ : raw_matcher_).Add(&added_.back());
  }
  raw_matcher_.Finalize();
  normalized_matcher_.Finalize();
  return absl::OkStatus();
}

absl::Status HfTokenizer::Load(const json& tok, const json& config, const json& generation, const std::string& origin) {
  if (!tok.is_object()) return Invalid(origin, "expected a JSON object");
  if (auto st = RejectUnknownKeys(tok,
                                  {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                                   "post_processor", "decoder", "model"},
                                  origin);
      !st.ok()) {
    return st;
  }
  for (const char* key : {"truncation", "padding"}) {
    if (tok.contains(key) && !tok[key].is_null()) {
      return Invalid(absl::StrCat(origin, ".", key), "is not supported (must be null)");
    }
  }
  auto decoder = ParseDecoder(Field(tok, "decoder"), origin + ".decoder");
  if (!decoder.ok()) return decoder.status();
  decoder_ = *std::move(decoder);
  auto normalizer = Normalizer::Parse(Field(tok, "normalizer"), origin + ".normalizer");
  if (!normalizer.ok()) return normalizer.status();
  normalizer_ = *std::move(normalizer);
  auto pre = PreTokenizer::Parse(Field(tok, "pre_tokenizer"), origin + ".pre_tokenizer");
  if (!pre.ok()) return pre.status();
  pre_tokenizer_ = *std::move(pre);
  // The byte-level vocabulary is spelled in the ByteLevel alphabet on both ends.
  if (decoder_.byte_level != pre_tokenizer_.has_byte_level()) {
    return Invalid(origin + ".pre_tokenizer",
                   "a ByteLevel pre-tokenizer and a ByteLevel decoder go together (one is missing)");
  }
  if (!decoder_.byte_level && !pre_tokenizer_.has_metaspace() && !normalizer_.is_metaspace_like()) {
    return Invalid(origin + ".normalizer",
                   "a SentencePiece-style tokenizer needs a Metaspace pre-tokenizer or a Prepend/Replace normalizer");
  }
  if (auto st = LoadModel(Field(tok, "model"), origin + ".model"); !st.ok()) return st;
  if (auto st = LoadAddedTokens(Field(tok, "added_tokens"), origin + ".added_tokens"); !st.ok()) return st;
  if (auto st = ParsePostProcessor(Field(tok, "post_processor"), origin + ".post_processor", &template_); !st.ok()) {
    return st;
  }
  for (int32_t id : template_.prefix) {
    if (id < 0 || id >= vocab_size()) return Invalid(origin + ".post_processor", "special token id out of range");
  }
  for (int32_t id : template_.suffix) {
    if (id < 0 || id >= vocab_size()) return Invalid(origin + ".post_processor", "special token id out of range");
  }
  // tokenizer_config.json: bos/eos, chat template.
  if (auto bos = ConfigToken(config, "bos_token")) {
    bos_ = TokenId(*bos);
  } else if (!template_.prefix.empty()) {
    bos_ = template_.prefix.front();
  }
  auto add_eos = [&](std::optional<int32_t> id) {
    if (id && std::find(eos_.begin(), eos_.end(), *id) == eos_.end()) eos_.push_back(*id);
  };
  if (auto eos = ConfigToken(config, "eos_token")) add_eos(TokenId(*eos));
  if (generation.is_object() && generation.contains("eos_token_id")) {
    const json& e = generation["eos_token_id"];
    if (e.is_number_integer()) add_eos(e.get<int32_t>());
    if (e.is_array()) {
      for (const json& x : e) {
        if (x.is_number_integer()) add_eos(x.get<int32_t>());
      }
    }
  }
  add_eos(TokenId("<|eot_id|>"));
  add_eos(TokenId("<|end_of_text|>"));
  eos_.erase(std::remove_if(eos_.begin(), eos_.end(), [&](int32_t id) { return id < 0 || id >= vocab_size(); }),
             eos_.end());
  if (auto ct = config.find("chat_template"); config.is_object() && ct != config.end()) {
    if (ct->is_string()) {
      chat_template_ = ct->get<std::string>();
    } else if (ct->is_array()) {  // [{"name": ..., "template": ...}]: the default one
      for (const json& t : *ct) {
        if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
          chat_template_ = t["template"].get<std::string>();
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status HfTokenizer::EncodeSegment(std::string_view text, bool at_origin, std::vector<int32_t>* ids) const {
  std::string normalized;
  if (!normalizer_.empty()) {
    if (auto st = normalizer_.Apply(text, &normalized); !st.ok()) return st;
    text = normalized;
  }
  std::vector<Segment> segments;
  if (normalized_matcher_.empty()) {
    segments.push_back({text, 0, -1});
  } else {
    normalized_matcher_.Split(text, 0, &segments);
  }
  Pieces pieces;
  BpeModel::Scratch scratch;
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids->push_back(s.id);
      continue;
    }
    if (auto st = pre_tokenizer_.Apply(s.text, at_origin && s.offset == 0, &pieces); !st.ok()) return st;
    for (std::string_view piece : pieces.list) {
      if (piece.empty()) continue;
      if (auto st = bpe_->EncodeWord(piece, &scratch, ids); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  if (const size_t bad = FirstInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("text is not valid UTF-8 (byte offset ", bad, ")"));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), template_.prefix.begin(), template_.prefix.end());
  std::vector<Segment> segments;
  if (raw_matcher_.empty()) {
    segments.push_back({text, 0, -1});
  } else {
    raw_matcher_.Split(text, 0, &segments);
  }
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else if (auto st = EncodeSegment(s.text, s.offset == 0, &ids); !st.ok()) {
      return st;
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), template_.suffix.begin(), template_.suffix.end());
  return ids;
}

absl::StatusOr<json> ParseJson(std::string_view text, const std::string& origin) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid JSON"));
  return j;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> ParseHfTokenizer(std::string_view tokenizer_json,
                                                            std::string_view tokenizer_config_json,
                                                            std::string_view generation_config_json,
                                                            const std::string& origin) {
  auto tok = ParseJson(tokenizer_json, origin);
  if (!tok.ok()) return tok.status();
  json config = json::object(), generation = json::object();
  if (!tokenizer_config_json.empty()) {
    auto c = ParseJson(tokenizer_config_json, "tokenizer_config.json");
    if (!c.ok()) return c.status();
    config = *std::move(c);
  }
  if (!generation_config_json.empty()) {
    auto g = ParseJson(generation_config_json, "generation_config.json");
    if (!g.ok()) return g.status();
    generation = *std::move(g);
  }
  auto t = std::make_unique<HfTokenizer>();
  if (auto st = t->Load(*tok, config, generation, origin); !st.ok()) return st;
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  auto tok = ReadRegularFile(path, kMaxTokenizerFileBytes);
  if (!tok.ok()) return tok.status();
  std::string config, generation;
  for (auto [name, out] : {std::pair{"/tokenizer_config.json", &config}, {"/generation_config.json", &generation}}) {
    auto c = ReadRegularFile(dir + name, kMaxTokenizerFileBytes);
    if (c.ok()) {
      *out = *std::move(c);
    } else if (!absl::IsNotFound(c.status())) {
      return c.status();
    }
  }
  return ParseHfTokenizer(*tok, config, generation, path);
}

}  // namespace fusedserve::tokenizer
