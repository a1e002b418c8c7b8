// UTF-8 helpers shared by encoding (validation, character stepping) and
// decoding (Rust's String::from_utf8_lossy, which Hugging Face's decoders
// use, applied incrementally).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fusedserve::tokenizer {

// Offset of the first byte that starts an invalid or truncated UTF-8
// sequence, or std::string_view::npos when `s` is valid UTF-8.
size_t FirstInvalidUtf8(std::string_view s);

// Length of the (valid) UTF-8 character starting with lead byte `b`.
inline int Utf8CharLen(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// Decodes the valid character at s[i] (advances i).
char32_t NextCodePoint(std::string_view s, size_t* i);
void AppendUtf8(char32_t cp, std::string* out);

// Appends `bytes` to `out` as from_utf8_lossy does: each maximal invalid
// subsequence becomes one U+FFFD. When `final` is false, a trailing
// incomplete but so-far valid character is not consumed: the return value is
// the number of bytes consumed (the caller keeps the rest for later).
size_t AppendUtf8Lossy(std::string_view bytes, bool final, std::string* out);

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace fusedserve::tokenizer
