// PCRE2 wrapper and the Oniguruma -> PCRE2 pattern translation.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace fusedserve::tokenizer {
namespace {

// Oniguruma's \s (Unicode White_Space). PCRE2's \s with UCP also matches
// U+180E, which White_Space dropped in Unicode 6.3.
constexpr absl::string_view kSpaceClassBody = "\\t\\n\\x0b\\f\\r\\p{Zs}\\x{85}\\x{2028}\\x{2029}";

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

absl::StatusOr<std::string> TranslateOnigPattern(std::string_view pattern, const std::string& field) {
  const std::string p(pattern);
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      switch (e) {
        case 's':
          out += in_class ? std::string(kSpaceClassBody) : absl::StrCat("[", kSpaceClassBody, "]");
          continue;
        case 'S':
          if (in_class) {
            return absl::InvalidArgumentError(
                absl::StrCat(field, ": \\S inside a character class is not supported in pattern '", p, "'"));
          }
          out += absl::StrCat("[^", kSpaceClassBody, "]");
          continue;
        // Oniguruma's \h is a hex digit (PCRE2: horizontal space); \w, \b
        // and \d classes differ in their Unicode coverage between the two.
        case 'h':
        case 'H':
        case 'w':
        case 'W':
        case 'b':
        case 'B':
        case 'y':
        case 'Y':
        case 'O':
        case 'g':
        case 'k':
          return absl::InvalidArgumentError(
              absl::StrCat(field, ": the escape \\", std::string(1, e), " is not supported in pattern '", p, "'"));
        default:
          out += '\\';
          out += e;
          continue;
      }
    }
    if (in_class) {
      if (c == ']') {
        in_class = false;
      } else if (c == '[' && !(i + 1 < p.size() && p[i + 1] == ':')) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": nested character classes are not supported in pattern '", p, "'"));
      } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": class intersection (&&) is not supported in pattern '", p, "'"));
      }
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      // A ']' or '^]' right after '[' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == '(' && i + 2 < p.size() && p[i + 1] == '?' && p[i + 2] == '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": the absent operator (?~...) is not supported in pattern '", p, "'"));
    }
    out += c;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, bool literal,
                                                      const std::string& field) {
  std::string translated(pattern);
  if (!literal) {
    auto t = TranslateOnigPattern(pattern, field);
    if (!t.ok()) return t.status();
    translated = *std::move(t);
  }
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &err,
                                   &err_offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": pattern '", std::string(pattern),
                                                   "' does not compile (PCRE2 at offset ", err_offset, ": ",
                                                   Pcre2Error(err), ")"));
  }
  std::unique_ptr<Regex> re(new Regex());
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  if (md == nullptr) return absl::ResourceExhaustedError("tokenizer: out of memory for a regex match");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  absl::Status status;
  while (pos < text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, md, nullptr) : PCRE2_ERROR_JIT_BADOPTION;
    // The JIT's stack can run out on long inputs: the interpreter keeps its
    // backtracking frames on the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = absl::ResourceExhaustedError(absl::StrCat("tokenizer: pre-tokenizer pattern failed: ", Pcre2Error(rc)));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      pos = e;
    } else {
      // Empty match: step over one character.
      pos = b + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
  return status;
}

}  // namespace fusedserve::tokenizer
