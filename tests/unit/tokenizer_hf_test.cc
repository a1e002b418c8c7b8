// The tokenizer.json loader on small hand-made tokenizers: byte-level BPE
// merges by rank, special tokens matched in text, BOS from the template,
// SentencePiece byte fallback and leading-space strip, streaming decode of
// split characters, invalid UTF-8, and the errors that name unsupported
// fields. (Equivalence with Hugging Face on trained and real tokenizers is
// tests/python/test_tokenizer.py.)
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include "nlohmann/json.hpp"
#include "tests/unit/tokenizer_json_fixtures.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/incremental_decoder.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer {
namespace {

using nlohmann::json;
using testing_fixtures::ByteLevelJson;
using testing_fixtures::SentencePieceJson;

std::unique_ptr<Tokenizer> Load(const json& j, const std::string& config = "") {
  auto t = ParseHfTokenizer(j.dump(), config, "", "tokenizer.json");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::string Stream(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  IncrementalDecoder d(t, skip);
  std::string out;
  for (int32_t id : ids) {
    const std::string piece = d.Push(id);
    EXPECT_EQ(FirstInvalidUtf8(piece), std::string_view::npos);
    out += piece;
  }
  return out + d.Flush();
}

TEST(HfTokenizer, ByteLevelMergesSpecialsAndTemplate) {
  auto t = Load(ByteLevelJson(), R"({"bos_token": "<|bos|>", "eos_token": "<|eot|>"})");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name(), "byte-level BPE (tokenizer.json)");
  EXPECT_EQ(t->vocab_size(), 263);
  EXPECT_EQ(t->bos_id(), 261);
  EXPECT_EQ(t->eos_ids(), std::vector<int32_t>{262});
  // "hello world<|eot|>": "hello" -> hell+o = 259; " world" -> " w" + o r l d.
  auto ids = t->Encode("hello world<|eot|>", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{261, 259, 260, 'o', 'r', 'l', 'd', 262}));
  EXPECT_EQ(t->Decode(*ids, false), "<|bos|>hello world<|eot|>");
  EXPECT_EQ(t->Decode(*ids, true), "hello world");
  EXPECT_TRUE(t->IsSpecial(262));
  EXPECT_FALSE(t->IsSpecial(259));
  EXPECT_EQ(t->TokenId("<|eot|>"), 262);
}

TEST(HfTokenizer, ByteLevelStreamsSplitCharacters) {
  auto t = Load(ByteLevelJson());
  ASSERT_NE(t, nullptr);
  const std::string text =
      "h\xC3\xA9 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB \xE4\xB8\xAD";  // hé 👩‍💻 中
  auto ids = t->Encode(text, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(t->Decode(*ids, false), text);
  EXPECT_EQ(Stream(*t, *ids), text);
  // A stream cut inside a character: Flush gives U+FFFD, as Decode does.
  std::vector<int32_t> cut(ids->begin(), ids->end() - 1);
  EXPECT_EQ(Stream(*t, cut), t->Decode(cut, false));
  EXPECT_EQ(t->Decode(cut, false).substr(t->Decode(cut, false).size() - 3), std::string(kReplacementChar));
}

TEST(HfTokenizer, InvalidUtf8IsRejectedWithOffset) {
  auto t = Load(ByteLevelJson());
  ASSERT_NE(t, nullptr);
  auto ids = t->Encode("ok\xC3(", true);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("byte offset 2"), std::string::npos) << ids.status();
}

TEST(HfTokenizer, SentencePieceByteFallbackAndLeadingSpace) {
  auto t = Load(SentencePieceJson(), R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>"})");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name(), "sentencepiece BPE (tokenizer.json)");
  EXPECT_TRUE(t->strips_leading_space());
  // "hi hé": ▁hi ▁h then é -> <0xC3><0xA9>.
  auto ids = t->Encode("hi h\xC3\xA9", true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 263, 262, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_TRUE(t->IsByteFallback(3 + 0xC3));
  EXPECT_EQ(t->Decode(*ids, true), "hi h\xC3\xA9");
  EXPECT_EQ(t->Decode(*ids, false), "<s> hi h\xC3\xA9");
  EXPECT_EQ(Stream(*t, *ids, true), "hi h\xC3\xA9");
  // An invalid run: one U+FFFD per byte (Hugging Face's ByteFallback).
  const std::string r(kReplacementChar);
  EXPECT_EQ(t->Decode({3 + 0xC3, 3 + 'A'}, false), r + r);
  EXPECT_EQ(Stream(*t, {3 + 0xC3, 3 + 'A'}), r + r);
  // "<s>" in text is the special token; each text piece gets its own "▁".
  auto s = t->Encode("<s>hi", false);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<int32_t>{1, 263}));
}

// Each edit makes the tokenizer unsupported: the error names the field.
TEST(HfTokenizer, UnsupportedFieldsAreNamed) {
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["model"]["type"] = "Unigram"; }, "tokenizer.json.model.type"},
      {[](json& j) { j["model"]["dropout"] = 0.5; }, "tokenizer.json.model.dropout"},
      {[](json& j) { j["model"]["frob"] = 1; }, "tokenizer.json.model.frob"},
      {[](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "tokenizer.json.normalizer.type"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "tokenizer.json.pre_tokenizer.type"},
      {[](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              json::array(
                  {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}, {"invert", false}},
                   {{"type", "ByteLevel"}, {"use_regex", false}}})}};
       },
       "tokenizer.json.pre_tokenizer.pretokenizers[0].pattern"},
      {[](json& j) {
         j["decoder"] = {{"type", "CTC"}};
       },
       "tokenizer.json.decoder.type"},
      {[](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "tokenizer.json.post_processor.type"},
      {[](json& j) { j["added_tokens"][0]["single_word"] = true; }, "tokenizer.json.added_tokens[0].single_word"},
      {[](json& j) { j["added_tokens"][0]["id"] = 7; }, "tokenizer.json.added_tokens[0].id"},
      {[](json& j) {
         j["padding"] = {{"strategy", "BatchLongest"}};
       },
       "tokenizer.json.padding"},
      {[](json& j) { j["model"]["merges"].push_back("x yz"); }, "tokenizer.json.model.merges[5]"},
  };
  for (const Case& c : cases) {
    json j = ByteLevelJson();
    c.edit(j);
    auto t = ParseHfTokenizer(j.dump(), "", "", "tokenizer.json");
    ASSERT_FALSE(t.ok()) << c.field;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    EXPECT_NE(t.status().message().find(c.field), std::string::npos) << t.status();
  }
  auto bad = ParseHfTokenizer("{not json", "", "", "tokenizer.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = LoadTokenizer("/nonexistent-dir");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(HfTokenizer, ConcurrentEncodesAgree) {
  // Encode is called from many request threads at once: the shared word
  // cache must not change results (TSan-clean by construction: one mutex per shard).
  auto t = Load(ByteLevelJson());
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(3);
  const char* words[] = {"hello", " world", " hell", "o", " wo", "\xC3\xA9t\xC3\xA9", " 123", "\n\n", " he"};
  std::vector<std::string> texts(64);
  for (auto& text : texts) {
    for (int k = 0; k < 200; ++k) text += words[rng() % 9];
  }
  std::vector<std::vector<int32_t>> want;
  for (const auto& text : texts) want.push_back(*t->Encode(text, true));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      for (int r = 0; r < 20; ++r) {
        for (size_t i = th; i < texts.size(); i += 3) {
          auto ids = t->Encode(texts[i], true);
          if (!ids.ok() || *ids != want[i]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Regex, OnigurumaTranslation) {
  auto t = TranslateOnigPattern(R"(\s+(?!\S)|[^\s\p{L}])", "f");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->find("\\s"), std::string::npos);  // spelled out as White_Space
  for (const char* bad : {R"(\w+)", R"(\h)", R"([\S])", R"([a-z&&[^aeiou]])", R"((?~abc))"}) {
    auto r = TranslateOnigPattern(bad, "pre_tokenizer.pattern");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("pre_tokenizer.pattern"), std::string::npos);
  }
  // U+180E is not White_Space (PCRE2's \s with UCP would match it).
  auto re = Regex::Compile(R"(\s+)", false, "f");
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)
                  ->FindAll("a\xE1\xA0\x8E"
                            "b \t\xE3\x80\x80",
                            &m)
                  .ok());
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{5, 10}));
}

}  // namespace
}  // namespace fusedserve::tokenizer
