// GPT-2's byte <-> character alphabet: byte-level BPE vocabularies spell
// each byte as one printable character (bytes_to_unicode in GPT-2's encoder.py).
#pragma once

#include <array>
#include <cstdint>

namespace fusedserve::tokenizer {

// The character each byte is spelled with.
inline const std::array<char32_t, 256>& ByteToChar() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
    return t;
  }();
  return table;
}

// The byte a character spells, or -1 (characters below U+0144 only).
inline int CharToByte(char32_t c) {
  static const std::array<int16_t, 0x144> table = [] {
    std::array<int16_t, 0x144> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[ByteToChar()[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return c < table.size() ? table[c] : -1;
}

}  // namespace fusedserve::tokenizer
