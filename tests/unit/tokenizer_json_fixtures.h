// Small hand-made tokenizer.json documents of both families, shared by
// tokenizer_hf_test.cc and the tokenizer fuzz target.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer::testing_fixtures {

using nlohmann::json;

inline std::string ByteLevelSpelling(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) AppendUtf8(ByteToChar()[b], &out);
  return out;
}

// Byte-level BPE: ids 0..255 the bytes, then merges "h e", "l l", "he ll",
// "hell o", " w"; specials <|bos|> <|eot|> after.
inline json ByteLevelJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteLevelSpelling(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}};
  json mj = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab[ByteLevelSpelling(a + b)] = id++;
    mj.push_back(json::array({ByteLevelSpelling(a), ByteLevelSpelling(b)}));
  }
  json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", mj}, {"ignore_merges", false}};
  j["added_tokens"] = json::array({
      {{"id", 261}, {"content", "<|bos|>"}, {"special", true}, {"normalized", false}},
      {{"id", 262}, {"content", "<|eot|>"}, {"special", true}, {"normalized", false}},
  });
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<|bos|>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<|bos|>", {{"id", "<|bos|>"}, {"ids", {261}}}}}}};
  return j;
}

// SentencePiece-style: <unk> <s> </s>, <0x00>..<0xFF>, then pieces.
inline json SentencePieceJson() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    vocab[buf] = 3 + b;
  }
  int id = 259;
  for (const char* p : {"\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi"}) vocab[p] = id++;
  json j;
  j["model"] = {{"type", "BPE"},        {"vocab", vocab},
                {"unk_token", "<unk>"}, {"byte_fallback", true},
                {"fuse_unk", true},     {"merges", json::array({"\xE2\x96\x81 h", "\xE2\x96\x81h i"})}};
  j["added_tokens"] = json::array({
      {{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
      {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
      {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}},
  });
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       json::array({{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                    {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}})}};
  j["pre_tokenizer"] = nullptr;
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                {{"type", "ByteFallback"}},
                                {{"type", "Fuse"}},
                                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}}}}}};
  return j;
}

}  // namespace fusedserve::tokenizer::testing_fixtures
