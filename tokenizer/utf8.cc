// UTF-8 validation and lossy decoding following the Unicode "maximal
// subpart" rule, which is what Rust's Utf8Chunks (from_utf8_lossy) does.
#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer {
namespace {

// Length of the valid prefix (1..4) of the sequence at s[i], and whether it
// is a complete character. A lone invalid byte gives {1, false} with
// `truncated` false.
struct SeqCheck {
  int valid_len;   // bytes belonging to this (possibly invalid) sequence
  bool complete;   // a whole valid character
  bool truncated;  // valid so far but ended by the end of input
};

SeqCheck CheckSeq(std::string_view s, size_t i) {
  const uint8_t b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {1, true, false};
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};
  }
  for (int k = 1; k < need; ++k) {
    if (i + k >= s.size()) return {k, false, true};
    const uint8_t b = static_cast<uint8_t>(s[i + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {k, false, false};
  }
  return {need, true, false};
}

}  // namespace

size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const SeqCheck c = CheckSeq(s, i);
    if (!c.complete) return i;
    i += c.valid_len;
  }
  return std::string_view::npos;
}

char32_t NextCodePoint(std::string_view s, size_t* i) {
  const uint8_t b0 = static_cast<uint8_t>(s[*i]);
  const int n = Utf8CharLen(b0);
  char32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[*i + k]) & 0x3F);
  *i += n;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < bytes.size()) {
    const SeqCheck c = CheckSeq(bytes, i);
    if (c.complete) {
      i += c.valid_len;
      continue;
    }
    out->append(bytes.data() + run, i - run);
    if (c.truncated && !final) return i;  // keep the incomplete tail
    out->append(kReplacementChar);
    i += c.valid_len;
    run = i;
  }
  out->append(bytes.data() + run, i - run);
  return i;
}

}  // namespace fusedserve::tokenizer
