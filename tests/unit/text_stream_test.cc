// TextStream (server/text.h) over the built-in byte tokenizer: stop strings
// matched across token boundaries and held back until they cannot match,
// multi-byte characters never split, and TextSupport's chat format and
// UTF-8 errors.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/text.h"

namespace fusedserve {
namespace {

std::unique_ptr<tokenizer::Tokenizer> Builtin() { return *tokenizer::BuiltinByteTokenizer(512); }

// Pushes `text` byte by byte (one token each); returns the piece of each push.
std::vector<std::string> PushBytes(TextStream& s, const std::string& text, bool* matched) {
  std::vector<std::string> pieces;
  for (unsigned char c : text) {
    pieces.push_back(s.Push(c, matched));
    if (*matched) break;
  }
  return pieces;
}

TEST(TextStreamTest, HoldsBackAPossibleStopAndCutsAtTheMatch) {
  auto tok = Builtin();
  TextStream s(*tok, true, {"END", "xyz"});
  bool matched = false;
  std::vector<std::string> p = PushBytes(s, "abEN", &matched);
  EXPECT_FALSE(matched);
  EXPECT_EQ(p, (std::vector<std::string>{"a", "b", "", ""}));  // "E", "EN" could start "END"
  p = PushBytes(s, "x", &matched);                             // "ENx" cannot: released, "x" held
  EXPECT_EQ(p, (std::vector<std::string>{"EN"}));
  p = PushBytes(s, "yzTAIL", &matched);
  EXPECT_TRUE(matched);
  EXPECT_EQ(p, (std::vector<std::string>{"", ""}));  // the match and nothing after
  EXPECT_EQ(s.Flush(), "");
}

TEST(TextStreamTest, FlushReleasesAnUnfinishedPrefix) {
  auto tok = Builtin();
  TextStream s(*tok, true, {"END"});
  bool matched = false;
  std::string all;
  for (const std::string& piece : PushBytes(s, "the EN", &matched)) all += piece;
  all += s.Flush();
  EXPECT_FALSE(matched);
  EXPECT_EQ(all, "the EN");
}

TEST(TextStreamTest, MultiByteStopsAndCharacters) {
  auto tok = Builtin();
  TextStream s(*tok, true, {"世界"});
  bool matched = false;
  std::string all;
  for (const std::string& piece : PushBytes(s, "hi 世 世界 no", &matched)) {
    // Never half a character.
    EXPECT_FALSE(InvalidUtf8Offset(piece).has_value());
    all += piece;
  }
  EXPECT_TRUE(matched);
  EXPECT_EQ(all, "hi 世 ");
}

TEST(TextStreamTest, NoStopsStreamsEverything) {
  auto tok = Builtin();
  TextStream s(*tok, false, {});
  bool matched = false;
  std::string all;
  std::vector<int32_t> ids = {'a', 260, 0xC3, 0xA9, 0xC3};
  for (int32_t id : ids) all += s.Push(id, &matched);
  all += s.Flush();
  EXPECT_EQ(all, tok->Decode(ids, false));
  EXPECT_EQ(all, "a<|eot_id|>\xC3\xA9\xEF\xBF\xBD");
}

TEST(TextSupportTest, ChatFormatAndErrors) {
  TextSupport text(Builtin(), "builtin");
  google::protobuf::RepeatedPtrField<v1::ChatMessage> m;
  v1::ChatMessage* u = m.Add();
  u->set_role("user");
  u->set_content(" hi\n");
  absl::StatusOr<std::string> p = text.FormatChat(m);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  absl::StatusOr<std::vector<int32_t>> bad = text.EncodeText("prompt", "ab\xF0\x9F", true);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("prompt: not valid UTF-8 (byte offset 2"), std::string::npos)
      << bad.status();

  TextSupport none("the checkpoint has no tokenizer: /m/tokenizer.json is missing");
  EXPECT_EQ(none.EncodeText("prompt", "x", true).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(none.FormatChat(m).status().message()).find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace fusedserve
