// Parsing of tokenizer.json's decoder and post-processor.
#include "tokenizer/hf_decoder.h"

#include "absl/strings/str_cat.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/sv.h"

namespace fusedserve::tokenizer {
namespace {

using nlohmann::json;

absl::Status Invalid(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", SV(what)));
}

// j[key] without a copy; null when absent.
const json& Field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

}  // namespace

absl::StatusOr<DecoderSpec> ParseDecoder(const json& j, const std::string& path) {
  DecoderSpec d;
  if (!j.is_object()) return Invalid(path, "a decoder is required (ByteLevel, Metaspace or a SentencePiece Sequence)");
  auto type = JsonString(j, "type", path);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") {
    d.byte_level = true;
    if (auto st = RejectUnknownKeys(j, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, path); !st.ok()) {
      return st;
    }
    return d;
  }
  if (*type == "Metaspace") {
    auto rep = JsonString(j, "replacement", path);
    if (!rep.ok()) return rep.status();
    d.replace_from = *rep;
    std::string scheme = "always";
    if (j.contains("prepend_scheme")) {
      auto s = JsonString(j, "prepend_scheme", path);
      if (!s.ok()) return s.status();
      scheme = *s;
    } else if (j.contains("add_prefix_space")) {
      auto aps = JsonBool(j, "add_prefix_space", true, path);
      if (!aps.ok()) return aps.status();
      scheme = *aps ? "always" : "never";
    }
    // The first token loses every replacement character (FirstTokenBytes),
    // which is not the Strip decoder's one leading space of the whole text.
    d.metaspace = scheme != "never";
    if (auto st = RejectUnknownKeys(
            j, {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"}, path);
        !st.ok()) {
      return st;
    }
    return d;
  }
  if (*type != "Sequence") {
    return Invalid(path + ".type", absl::StrCat("decoder '", *type,
                                                "' is not supported (supported: ByteLevel, "
                                                "Metaspace, Sequence of Replace/ByteFallback/Fuse/Strip)"));
  }
  auto it = j.find("decoders");
  if (it == j.end() || !it->is_array()) return Invalid(path + ".decoders", "expected an array");
  bool fused = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& s = (*it)[i];
    const std::string p = absl::StrCat(path, ".decoders[", i, "]");
    if (!s.is_object()) return Invalid(p, "expected an object");
    auto t = JsonString(s, "type", p);
    if (!t.ok()) return t.status();
    if (*t == "Replace") {
      auto pat = s.find("pattern");
      auto content = JsonString(s, "content", p);
      if (!content.ok()) return content.status();
      if (pat == s.end() || !pat->is_object() || !pat->contains("String") || !(*pat)["String"].is_string() ||
          *content != " " || !d.replace_from.empty() || fused) {
        return Invalid(p, "only one Replace of a String pattern with \" \" before Fuse is supported");
      }
      d.replace_from = (*pat)["String"].get<std::string>();
      if (auto st = RejectUnknownKeys(s, {"type", "pattern", "content"}, p); !st.ok()) return st;
    } else if (*t == "ByteFallback") {
      if (fused) return Invalid(p, "ByteFallback after Fuse is not supported");
      d.byte_fallback = true;
      if (auto st = RejectUnknownKeys(s, {"type"}, p); !st.ok()) return st;
    } else if (*t == "Fuse") {
      fused = true;
      if (auto st = RejectUnknownKeys(s, {"type"}, p); !st.ok()) return st;
    } else if (*t == "Strip") {
      auto content = JsonString(s, "content", p);
      if (!content.ok()) return content.status();
      const bool ok =
          fused && *content == " " && s.value("start", -1) == 1 && s.value("stop", -1) == 0 && !d.strip_leading_space;
      if (!ok) return Invalid(p, "only Strip(content \" \", start 1, stop 0) after Fuse is supported");
      d.strip_leading_space = true;
      if (auto st = RejectUnknownKeys(s, {"type", "content", "start", "stop"}, p); !st.ok()) return st;
    } else {
      return Invalid(p + ".type", absl::StrCat("decoder '", *t, "' is not supported in a Sequence"));
    }
  }
  if (d.replace_from.empty()) return Invalid(path, "a SentencePiece decoder Sequence needs Replace(\"▁\", \" \")");
  return d;
}

namespace {

absl::Status ParseTemplateProcessing(const json& j, const std::string& path, Template* t) {
  if (auto st = RejectUnknownKeys(j, {"type", "single", "pair", "special_tokens"}, path); !st.ok()) return st;
  auto single = j.find("single");
  if (single == j.end() || !single->is_array()) return Invalid(path + ".single", "expected an array");
  const json& specials = Field(j, "special_tokens");
  bool seen_a = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& item = (*single)[i];
    const std::string p = absl::StrCat(path, ".single[", i, "]");
    if (item.is_object() && item.contains("Sequence")) {
      if (item["Sequence"].value("id", "") != "A" || seen_a) return Invalid(p, "only one Sequence A is supported");
      seen_a = true;
    } else if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
               item["SpecialToken"]["id"].is_string()) {
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      auto sp = specials.find(name);
      if (sp == specials.end() || !sp->contains("ids") || !(*sp)["ids"].is_array()) {
        return Invalid(p, absl::StrCat("special token '", name, "' is not in special_tokens"));
      }
      for (const json& id : (*sp)["ids"]) {
        if (!id.is_number_integer()) return Invalid(path + ".special_tokens", "ids must be integers");
        (seen_a ? t->suffix : t->prefix).push_back(id.get<int32_t>());
      }
    } else {
      return Invalid(p, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  if (!seen_a) return Invalid(path + ".single", "has no Sequence A");
  return absl::OkStatus();
}

}  // namespace

absl::Status ParsePostProcessor(const json& j, const std::string& path, Template* t) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_object()) return Invalid(path, "expected an object");
  auto type = JsonString(j, "type", path);
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") {  // offsets only
    return RejectUnknownKeys(j, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, path);
  }
  if (*type == "TemplateProcessing") return ParseTemplateProcessing(j, path, t);
  if (*type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) return Invalid(path + ".processors", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      if (auto st = ParsePostProcessor((*it)[i], absl::StrCat(path, ".processors[", i, "]"), t); !st.ok()) return st;
    }
    return RejectUnknownKeys(j, {"type", "processors"}, path);
  }
  return Invalid(path + ".type",
                 absl::StrCat("post-processor '", *type,
                              "' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)"));
}

}  // namespace fusedserve::tokenizer
