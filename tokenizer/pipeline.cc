// Added-token matching, normalizers and pre-tokenizers of tokenizer.json.
#include "tokenizer/pipeline.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tokenizer/sv.h"
#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581 "▁"

// Rust's char::is_whitespace (Unicode White_Space).
bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Start of the run of whitespace that ends `s`.
size_t TrailingSpaceStart(std::string_view s) {
  size_t i = 0, start = 0;
  while (i < s.size()) {
    if (!IsWhiteSpace(NextCodePoint(s, &i))) start = i;
  }
  return start;
}

// Length of the run of whitespace that starts `s`.
size_t LeadingSpaceLen(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!IsWhiteSpace(NextCodePoint(s, &j))) break;
    i = j;
  }
  return i;
}

std::string ReplaceAll(std::string_view in, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(in.size() + in.size() / 4);
  size_t pos = 0;
  while (true) {
    const size_t hit = in.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(in.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(in.substr(pos));
  return out;
}

}  // namespace

// ---- JSON helpers -----------------------------------------------------------------

absl::StatusOr<std::string> JsonString(const nlohmann::json& j, const std::string& key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ".", key, ": expected a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<bool> JsonBool(const nlohmann::json& j, const std::string& key, bool fallback, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return absl::InvalidArgumentError(absl::StrCat(path, ".", key, ": expected true or false"));
  return it->get<bool>();
}

absl::Status RejectUnknownKeys(const nlohmann::json& j, std::initializer_list<std::string_view> known,
                               const std::string& path) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      std::string names;
      for (std::string_view k : known) names += (names.empty() ? "" : ", ") + std::string(k);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".", it.key(), ": option not supported (known: ", names, ")"));
    }
  }
  return absl::OkStatus();
}

// ---- added tokens ---------------------------------------------------------------

void AddedTokenMatcher::Add(const AddedToken* token) { tokens_.push_back(token); }

void AddedTokenMatcher::Finalize() {
  by_first_byte_.assign(256, {});
  for (const AddedToken* t : tokens_) {
    if (!t->content.empty()) by_first_byte_[static_cast<uint8_t>(t->content[0])].push_back(t);
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(),
                     [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  }
}

void AddedTokenMatcher::Split(std::string_view text, size_t offset, std::vector<Segment>* out) const {
  size_t done = 0;  // text[0, done) is already in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& cands = by_first_byte_[static_cast<uint8_t>(text[pos])];
    const AddedToken* hit = nullptr;
    for (const AddedToken* t : cands) {
      if (text.compare(pos, t->content.size(), t->content) == 0) {
        hit = t;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->content.size();
    // (Scanning from `done` only: the whitespace cannot reach into an earlier match.)
    if (hit->lstrip) start = done + TrailingSpaceStart(text.substr(done, start - done));
    if (hit->rstrip) stop += LeadingSpaceLen(text.substr(stop));
    if (start > done) out->push_back({text.substr(done, start - done), offset + done, -1});
    out->push_back({text.substr(start, stop - start), offset + start, hit->id});
    done = pos = stop;
  }
  if (done < text.size()) out->push_back({text.substr(done), offset + done, -1});
}

// ---- normalizer -------------------------------------------------------------------

absl::StatusOr<Normalizer> Normalizer::Parse(const nlohmann::json& j, const std::string& path) {
  Normalizer n;
  if (j.is_null()) return n;
  if (absl::Status st = n.ParseStep(j, path); !st.ok()) return st;
  return n;
}

absl::Status Normalizer::ParseStep(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": expected an object"));
  auto type = JsonString(j, "type", path);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".normalizers: expected an array"));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      if (absl::Status st = ParseStep((*it)[i], absl::StrCat(path, ".normalizers[", i, "]")); !st.ok()) return st;
    }
    return RejectUnknownKeys(j, {"type", "normalizers"}, path);
  }
  if (*type == "Prepend") {
    auto s = JsonString(j, "prepend", path);
    if (!s.ok()) return s.status();
    steps_.push_back({Step::kPrepend, *s, ""});
    return RejectUnknownKeys(j, {"type", "prepend"}, path);
  }
  if (*type == "Replace") {
    auto pat = j.find("pattern");
    if (pat == j.end() || !pat->is_object() || !pat->contains("String") || !(*pat)["String"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".pattern: only {\"String\": ...} patterns are supported for Replace"));
    }
    auto content = JsonString(j, "content", path);
    if (!content.ok()) return content.status();
    const std::string from = (*pat)["String"].get<std::string>();
    if (from.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ".pattern: empty"));
    steps_.push_back({Step::kReplace, from, *content});
    return RejectUnknownKeys(j, {"type", "pattern", "content"}, path);
  }
  if (*type == "NFC" || *type == "NFKC" || *type == "NFD" || *type == "NFKD") {
    steps_.push_back({Step::kUnicode, *type, ""});
    return RejectUnknownKeys(j, {"type"}, path);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ".type: normalizer '", *type,
                   "' is not supported (supported: Sequence, Prepend, Replace, NFC, NFKC, NFD, NFKD)"));
}

bool Normalizer::is_metaspace_like() const {
  for (const Step& s : steps_) {
    if (s.kind == Step::kUnicode) return false;
  }
  return !steps_.empty();
}

absl::Status Normalizer::Apply(std::string_view in, std::string* out) const {
  std::string cur(in);
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::kPrepend:
        if (!cur.empty()) cur.insert(0, s.from);
        break;
      case Step::kReplace:
        if (cur.find(s.from) != std::string::npos) cur = ReplaceAll(cur, s.from, s.to);
        break;
      case Step::kUnicode: {
        UErrorCode err = U_ZERO_ERROR;
        const icu::Normalizer2* nfc = s.from == "NFC"    ? icu::Normalizer2::getNFCInstance(err)
                                      : s.from == "NFKC" ? icu::Normalizer2::getNFKCInstance(err)
                                      : s.from == "NFD"  ? icu::Normalizer2::getNFDInstance(err)
                                                         : icu::Normalizer2::getNFKDInstance(err);
        if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("tokenizer: ICU ", s.from, ": ", u_errorName(err)));
        const icu::StringPiece sp(cur.data(), static_cast<int32_t>(cur.size()));
        if (nfc->isNormalizedUTF8(sp, err) && U_SUCCESS(err)) break;
        err = U_ZERO_ERROR;
        std::string normalized;
        icu::StringByteSink<std::string> sink(&normalized);
        nfc->normalizeUTF8(0, sp, sink, nullptr, err);
        if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("tokenizer: ICU ", s.from, ": ", u_errorName(err)));
        cur = std::move(normalized);
        break;
      }
    }
  }
  *out = std::move(cur);
  return absl::OkStatus();
}

// ---- pre-tokenizer ------------------------------------------------------------------

absl::StatusOr<PreTokenizer> PreTokenizer::Parse(const nlohmann::json& j, const std::string& path) {
  PreTokenizer p;
  if (j.is_null()) return p;
  if (absl::Status st = p.ParseStep(j, path); !st.ok()) return st;
  return p;
}

absl::Status PreTokenizer::ParseStep(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": expected an object"));
  auto type = JsonString(j, "type", path);
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".pretokenizers: expected an array"));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      if (absl::Status st = ParseStep((*it)[i], absl::StrCat(path, ".pretokenizers[", i, "]")); !st.ok()) return st;
    }
    return RejectUnknownKeys(j, {"type", "pretokenizers"}, path);
  }
  Step step;
  if (*type == "Split") {
    step.kind = Step::kSplit;
    auto pat = j.find("pattern");
    const bool is_regex = pat != j.end() && pat->is_object() && pat->contains("Regex") && (*pat)["Regex"].is_string();
    const bool is_string =
        pat != j.end() && pat->is_object() && pat->contains("String") && (*pat)["String"].is_string();
    if (!is_regex && !is_string) {
      return absl::InvalidArgumentError(absl::StrCat(path, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}"));
    }
    auto re = Regex::Compile((*pat)[is_regex ? "Regex" : "String"].get<std::string>(), !is_regex,
                             absl::StrCat(path, ".pattern"));
    if (!re.ok()) return re.status();
    step.regex = std::move(*re);
    auto behavior = JsonString(j, "behavior", path);
    if (!behavior.ok()) return behavior.status();
    if (*behavior == "Removed") {
      step.removed = true;
    } else if (*behavior != "Isolated") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ".behavior: '", *behavior, "' is not supported (supported: Isolated, Removed)"));
    }
    auto invert = JsonBool(j, "invert", false, path);
    if (!invert.ok()) return invert.status();
    if (*invert) return absl::InvalidArgumentError(absl::StrCat(path, ".invert: true is not supported"));
    steps_.push_back(std::move(step));
    return RejectUnknownKeys(j, {"type", "pattern", "behavior", "invert"}, path);
  }
  if (*type == "ByteLevel") {
    step.kind = Step::kByteLevel;
    auto aps = JsonBool(j, "add_prefix_space", true, path);
    auto use_regex = JsonBool(j, "use_regex", true, path);
    if (!aps.ok()) return aps.status();
    if (!use_regex.ok()) return use_regex.status();
    step.add_prefix_space = *aps;
    if (*use_regex) {
      auto re = Regex::Compile(kGpt2Pattern, false, path);
      if (!re.ok()) return re.status();
      step.regex = std::move(*re);
    }
    has_byte_level_ = true;
    steps_.push_back(std::move(step));
    // trim_offsets only moves offsets, never ids.
    return RejectUnknownKeys(j, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, path);
  }
  if (*type == "Metaspace") {
    step.kind = Step::kMetaspace;
    auto rep = JsonString(j, "replacement", path);
    if (!rep.ok()) return rep.status();
    step.replacement = *rep;
    auto split = JsonBool(j, "split", true, path);
    if (!split.ok()) return split.status();
    step.split = *split;
    if (j.contains("prepend_scheme")) {
      auto scheme = JsonString(j, "prepend_scheme", path);
      if (!scheme.ok()) return scheme.status();
      if (*scheme == "always") {
        step.prepend = Step::kAlways;
      } else if (*scheme == "first") {
        step.prepend = Step::kFirst;
      } else if (*scheme == "never") {
        step.prepend = Step::kNever;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(path, ".prepend_scheme: '", *scheme, "' is not supported"));
      }
    } else {
      // Before prepend_scheme existed: add_prefix_space (true: always).
      auto aps = JsonBool(j, "add_prefix_space", true, path);
      if (!aps.ok()) return aps.status();
      step.prepend = *aps ? Step::kAlways : Step::kNever;
    }
    has_metaspace_ = true;
    steps_.push_back(std::move(step));
    return RejectUnknownKeys(j, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"},
                             path);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path, ".type: pre-tokenizer '", *type, "' is not supported (supported: Sequence, Split, ByteLevel, Metaspace)"));
}

absl::Status PreTokenizer::Apply(std::string_view segment, bool at_origin, Pieces* out) const {
  out->clear();
  out->list.push_back(segment);
  for (const Step& s : steps_) {
    if (absl::Status st = ApplyStep(s, at_origin, out); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status PreTokenizer::ApplyStep(const Step& s, bool at_origin, Pieces* p) const {
  std::vector<std::string_view> next;
  next.reserve(p->list.size() * 2);
  for (size_t k = 0; k < p->list.size(); ++k) {
    std::string_view piece = p->list[k];
    if (s.kind == Step::kMetaspace) {
      std::string m = ReplaceAll(piece, " ", s.replacement);
      const bool starts = m.compare(0, s.replacement.size(), s.replacement) == 0;
      if (!starts && (s.prepend == Step::kAlways || (s.prepend == Step::kFirst && at_origin && k == 0))) {
        m.insert(0, s.replacement);
      }
      std::string_view v = p->storage.emplace_back(std::move(m));
      if (!s.split) {
        if (!v.empty()) next.push_back(v);
        continue;
      }
      // A new piece starts at each replacement character (MergedWithNext).
      size_t start = 0;
      while (start < v.size()) {
        size_t hit = v.find(s.replacement, start + 1);
        if (hit == std::string_view::npos) hit = v.size();
        next.push_back(v.substr(start, hit - start));
        start = hit;
      }
      continue;
    }
    if (s.kind == Step::kByteLevel && s.add_prefix_space && !piece.empty() && piece[0] != ' ') {
      piece = p->storage.emplace_back(absl::StrCat(" ", SV(piece)));
    }
    if (s.regex == nullptr) {
      if (!piece.empty()) next.push_back(piece);
      continue;
    }
    p->matches.clear();
    if (absl::Status st = s.regex->FindAll(piece, &p->matches); !st.ok()) return st;
    size_t done = 0;
    for (const auto& [b, e] : p->matches) {
      if (b > done) next.push_back(piece.substr(done, b - done));
      if (!s.removed) next.push_back(piece.substr(b, e - b));
      done = e;
    }
    if (done < piece.size()) next.push_back(piece.substr(done));
  }
  p->list = std::move(next);
  return absl::OkStatus();
}

}  // namespace fusedserve::tokenizer
