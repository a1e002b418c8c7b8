// IncrementalDecoder and the from_utf8_lossy helpers, over a fake tokenizer
// whose tokens are arbitrary byte strings: characters split across tokens,
// invalid bytes, byte-fallback runs, the SentencePiece leading-space strip.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tokenizer/incremental_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer {
namespace {

// id -> bytes; ids >= 1000 are byte-fallback tokens of byte (id - 1000);
// id 999 is special "<s>".
class FakeTokenizer : public Tokenizer {
 public:
  explicit FakeTokenizer(std::map<int32_t, std::string> tokens, bool strip = false)
      : tokens_(std::move(tokens)), strip_(strip) {}
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view, bool) const override {
    return absl::UnimplementedError("fake");
  }
  std::string TokenBytes(int32_t id) const override {
    if (id >= 1000) return std::string(1, static_cast<char>(id - 1000));
    if (id == 999) return "<s>";
    auto it = tokens_.find(id);
    return it == tokens_.end() ? "" : it->second;
  }
  std::string Decode(absl::Span<const int32_t> ids, bool skip) const override {
    return DecodeFromTokenBytes(*this, ids, skip);
  }
  bool strips_leading_space() const override { return strip_; }
  bool IsSpecial(int32_t id) const override { return id == 999; }
  bool IsByteFallback(int32_t id) const override { return id >= 1000; }
  std::optional<int32_t> TokenId(std::string_view) const override { return std::nullopt; }
  int32_t vocab_size() const override { return 1256; }
  std::optional<int32_t> bos_id() const override { return 999; }
  std::vector<int32_t> eos_ids() const override { return {}; }
  std::string name() const override { return "fake"; }
  const std::string& chat_template() const override { return template_; }

 private:
  std::map<int32_t, std::string> tokens_;
  bool strip_;
  std::string template_;
};

std::vector<std::string> Pieces(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip = false) {
  IncrementalDecoder d(t, skip);
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(d.Push(id));
  out.push_back(d.Flush());
  return out;
}

std::string Concat(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& p : v) s += p;
  return s;
}

TEST(Utf8Lossy, MatchesRustMaximalSubpart) {
  auto lossy = [](std::string_view s) {
    std::string out;
    AppendUtf8Lossy(s, true, &out);
    return out;
  };
  const std::string r(kReplacementChar);
  EXPECT_EQ(lossy("abc"), "abc");
  EXPECT_EQ(lossy("\xE4\xB8"), r);  // truncated 3-byte char: one U+FFFD
  EXPECT_EQ(lossy("\xE4\xB8"
                  "a"),
            r + "a");                           // ended by ASCII
  EXPECT_EQ(lossy("\xFF\xFE"), r + r);          // two invalid bytes
  EXPECT_EQ(lossy("\xED\xA0\x80"), r + r + r);  // surrogate: E D not followed by A0
  EXPECT_EQ(lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(lossy("\xC0\x80"), r + r);                  // overlong lead
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("ok\xC3\xA9\xFF"), 4u);
  EXPECT_EQ(FirstInvalidUtf8("ok\xE4\xB8"), 2u);
  EXPECT_EQ(FirstInvalidUtf8("0123456789abcdef\xC3\xA9"), std::string_view::npos);
}

TEST(IncrementalDecoder, NeverEmitsHalfACharacter) {
  // "😀" (F0 9F 98 80) split over three tokens, then "é" split in two.
  FakeTokenizer t({{1, "a\xF0"},
                   {2, "\x9F\x98"},
                   {3,
                    "\x80"
                    "b"},
                   {4, "\xC3"},
                   {5, "\xA9"}});
  const auto p = Pieces(t, {1, 2, 3, 4, 5});
  EXPECT_EQ(p[0], "a");
  EXPECT_EQ(p[1], "");
  EXPECT_EQ(p[2],
            "\xF0\x9F\x98\x80"
            "b");
  EXPECT_EQ(p[3], "");
  EXPECT_EQ(p[4], "\xC3\xA9");
  EXPECT_EQ(p[5], "");
  for (const auto& s : p) EXPECT_EQ(FirstInvalidUtf8(s), std::string_view::npos);
}

TEST(IncrementalDecoder, InvalidBytesBecomeReplacementAtOnce) {
  FakeTokenizer t({{1, "a\xFF"}, {2, "\xE4\xB8"}, {3, "z"}});
  const std::string r(kReplacementChar);
  EXPECT_EQ(Pieces(t, {1, 2, 3}), (std::vector<std::string>{"a" + r, "", r + "z", ""}));
  EXPECT_EQ(Pieces(t, {2}), (std::vector<std::string>{"", r}));  // truncated at the end
}

TEST(IncrementalDecoder, ByteFallbackRunsDecodeWhole) {
  FakeTokenizer t({{1, " hi"}, {2, " x"}}, /*strip=*/true);
  const std::string r(kReplacementChar);
  // "中" = E4 B8 AD as three byte tokens, held until the run ends.
  EXPECT_EQ(Pieces(t, {1, 1000 + 0xE4, 1000 + 0xB8, 1000 + 0xAD, 2}),
            (std::vector<std::string>{"hi", "", "", "", "\xE4\xB8\xAD x", ""}));
  // Invalid anywhere: one U+FFFD per byte of the run (Hugging Face's ByteFallback).
  EXPECT_EQ(Concat(Pieces(t, {1000 + 'A', 1000 + 0xE4, 1000 + 0xB8})), r + r + r);
  // A run that starts the text loses its leading space like any first text.
  EXPECT_EQ(Concat(Pieces(t, {1000 + ' ', 1000 + 'A', 2})), "A x");
}

TEST(IncrementalDecoder, UnknownIdsAreDropped) {
  // As in Hugging Face: an id without a token neither emits nor ends a
  // byte-fallback run, nor counts as the first token.
  FakeTokenizer t({{1, " x"}}, /*strip=*/true);
  EXPECT_EQ(Concat(Pieces(t, {-1, 5000, 1000 + 0xE4, 5000, 1000 + 0xB8, 1000 + 0xAD, 1})), "\xE4\xB8\xAD x");
  EXPECT_EQ(Concat(Pieces(t, {5000, 1})), "x");
}

TEST(IncrementalDecoder, LeadingSpaceStripAndSpecials) {
  FakeTokenizer t({{1, " Hello"}, {2, " world"}}, /*strip=*/true);
  EXPECT_EQ(Concat(Pieces(t, {1, 2})), "Hello world");
  EXPECT_EQ(Concat(Pieces(t, {999, 1, 2})), "<s> Hello world");
  EXPECT_EQ(Concat(Pieces(t, {999, 1, 2}, /*skip=*/true)), "Hello world");
  FakeTokenizer nostrip({{1, " Hello"}});
  EXPECT_EQ(Concat(Pieces(nostrip, {1})), " Hello");
}

TEST(IncrementalDecoder, ConcatEqualsDecodeOnRandomStreams) {
  // Tokens of random bytes (mostly pieces of valid multi-byte text), random
  // byte-fallback runs and specials: streaming always equals Decode.
  const std::string text = "h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB \xFF";
  std::map<int32_t, std::string> tokens;
  for (int i = 0; i + 1 < 200; ++i) tokens[i] = text.substr(i % text.size(), 1 + i % 3);
  for (bool strip : {false, true}) {
    FakeTokenizer t(tokens, strip);
    std::mt19937 rng(7);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int32_t> ids;
      const int n = rng() % 20;
      for (int k = 0; k < n; ++k) {
        const int kind = rng() % 10;
        ids.push_back(kind < 7 ? rng() % 199 : kind < 9 ? 1000 + static_cast<int>(rng() % 256) : 999);
      }
      for (bool skip : {false, true}) {
        const auto p = Pieces(t, ids, skip);
        EXPECT_EQ(Concat(p), t.Decode(ids, skip));
        for (const auto& s : p) EXPECT_EQ(FirstInvalidUtf8(s), std::string_view::npos);
      }
    }
  }
}

}  // namespace
}  // namespace fusedserve::tokenizer
