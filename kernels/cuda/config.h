// The one grammar of every kernel family's config string (the tuning cache
// stores these): dot-separated fields of one letter and a decimal value, e.g.
// "t256.r1" (norm), "m128.w4" (attention), "p0.a3" (linear). Each family's
// typed config (NormConfig, AttentionConfig, LinearConfig, ...) sits in its
// header with Format/Parse functions that fix the letters and their order;
// a string that does not parse means "the family's default". Plain C++:
// included by the .cu kernels and the host dispatch alike.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fusedserve::cuda {

// Splits a config string into its (letter, value) fields; false on any
// malformed field.
inline bool ParseConfigFields(const std::string& s, std::vector<std::pair<char, int>>* fields) {
  fields->clear();
  size_t i = 0;
  while (i < s.size()) {
    const char key = s[i++];
    if (key < 'a' || key > 'z') return false;
    int64_t value = 0;
    size_t digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      value = value * 10 + (s[i++] - '0');
      if (value > (1 << 24)) return false;
      ++digits;
    }
    if (digits == 0) return false;
    fields->emplace_back(key, static_cast<int>(value));
    if (i < s.size()) {
      if (s[i] != '.') return false;
      if (++i == s.size()) return false;
    }
  }
  return !fields->empty();
}

// Parses "k1<v1>.k2<v2>..." whose letters are exactly `keys` in order.
inline bool ParseConfigInts(const std::string& s, const char* keys, std::vector<int>* values) {
  std::vector<std::pair<char, int>> fields;
  if (!ParseConfigFields(s, &fields)) return false;
  size_t n = 0;
  while (keys[n] != '\0') ++n;
  if (fields.size() != n) return false;
  values->clear();
  for (size_t i = 0; i < n; ++i) {
    if (fields[i].first != keys[i]) return false;
    values->push_back(fields[i].second);
  }
  return true;
}

// "t256.r1" from ("tr", {256, 1}): the inverse of ParseConfigInts.
inline std::string FormatConfigInts(const char* keys, const std::vector<int>& values) {
  std::string s;
  for (size_t i = 0; keys[i] != '\0' && i < values.size(); ++i) {
    if (i > 0) s += '.';
    s += keys[i];
    s += std::to_string(values[i]);
  }
  return s;
}

}  // namespace fusedserve::cuda
