// The text stages before the BPE model, as tokenizer.json describes them:
// added tokens split out of the text, the normalizer, the pre-tokenizer.
// Each is parsed from its JSON object; anything not implemented is
// INVALID_ARGUMENT naming the JSON path.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/regex.h"

namespace fusedserve::tokenizer {

// ---- added tokens -----------------------------------------------------------
struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false;
  bool normalized = false;
};

// A piece of text between added tokens (id < 0), or an added token.
struct Segment {
  std::string_view text;
  size_t offset = 0;  // in the original text (Metaspace's prepend_scheme "first")
  int32_t id = -1;
};

// Leftmost-longest matching of a set of added tokens (Hugging Face's
// aho-corasick MatchKind::LeftmostLongest), with lstrip/rstrip.
class AddedTokenMatcher {
 public:
  void Add(const AddedToken* token);
  void Finalize();
  bool empty() const { return tokens_.empty(); }
  // Splits `text` (at `offset` in the original) into segments, appended to `out`.
  void Split(std::string_view text, size_t offset, std::vector<Segment>* out) const;

 private:
  std::vector<const AddedToken*> tokens_;
  std::vector<std::vector<const AddedToken*>> by_first_byte_;  // longest first
};

// ---- normalizer ---------------------------------------------------------------
class Normalizer {
 public:
  // `j` is tokenizer.json's "normalizer" (may be null).
  static absl::StatusOr<Normalizer> Parse(const nlohmann::json& j, const std::string& path);
  bool empty() const { return steps_.empty(); }
  // Whether Apply only prepends "▁" and replaces ' ' with "▁" (SentencePiece legacy).
  bool is_metaspace_like() const;
  absl::Status Apply(std::string_view in, std::string* out) const;

 private:
  struct Step {
    enum Kind { kPrepend, kReplace, kUnicode } kind;
    std::string from, to;  // kUnicode: the form in `from` (ICU)
  };
  absl::Status ParseStep(const nlohmann::json& j, const std::string& path);
  std::vector<Step> steps_;
};

// ---- pre-tokenizer --------------------------------------------------------------
// Pieces of one segment: views into the segment or into `storage`.
struct Pieces {
  std::vector<std::string_view> list;
  std::deque<std::string> storage;
  std::vector<std::pair<size_t, size_t>> matches;  // scratch
  void clear() {
    list.clear();
    storage.clear();
  }
};

class PreTokenizer {
 public:
  static absl::StatusOr<PreTokenizer> Parse(const nlohmann::json& j, const std::string& path);
  bool has_byte_level() const { return has_byte_level_; }
  bool has_metaspace() const { return has_metaspace_; }
  // Splits `segment` into pieces. `at_origin`: the segment starts the text.
  absl::Status Apply(std::string_view segment, bool at_origin, Pieces* out) const;

 private:
  struct Step {
    enum Kind { kSplit, kByteLevel, kMetaspace } kind;
    std::shared_ptr<Regex> regex;  // Split, ByteLevel with use_regex
    bool removed = false;          // Split behavior Removed (else Isolated)
    bool add_prefix_space = false;
    std::string replacement;  // Metaspace
    enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;
    bool split = true;
  };
  absl::Status ParseStep(const nlohmann::json& j, const std::string& path);
  absl::Status ApplyStep(const Step& step, bool at_origin, Pieces* p) const;
  std::vector<Step> steps_;
  bool has_byte_level_ = false, has_metaspace_ = false;
};

// The GPT-2 pattern of the ByteLevel pre-tokenizer (use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Field helpers: INVALID_ARGUMENT naming `path` when the type is wrong.
absl::StatusOr<std::string> JsonString(const nlohmann::json& j, const std::string& key, const std::string& path);
absl::StatusOr<bool> JsonBool(const nlohmann::json& j, const std::string& key, bool fallback, const std::string& path);
absl::Status RejectUnknownKeys(const nlohmann::json& j, std::initializer_list<std::string_view> known,
                               const std::string& path);

}  // namespace fusedserve::tokenizer
