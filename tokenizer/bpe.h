// The BPE model of tokenizer.json: a word (one pre-token) is split into
// initial symbols (bytes for byte-level BPE, characters otherwise), then the
// adjacent pair of lowest merge rank is merged until none is left, as
// Hugging Face's Word::merge_all does (ties: leftmost first). O(n log n) per
// word with a heap; scratch buffers are reused across words.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace fusedserve::tokenizer {

struct BpeOptions {
  bool byte_level = false;     // initial symbols are bytes (vocab keys decoded from the byte-level alphabet)
  bool byte_fallback = false;  // unknown characters become <0xNN> tokens
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself in the vocab is one token (Llama-3)
  int32_t unk_id = -1;         // -1: none (an unknown symbol is an error)
};

class BpeModel {
 public:
  BpeModel(BpeOptions options) : options_(options) {}

  // Vocabulary entry: `key` is the byte string the token stands for in the
  // model's symbol space (raw bytes for byte-level BPE, the UTF-8 piece
  // otherwise).
  void Reserve(size_t tokens, size_t merges) {
    vocab_.reserve(tokens);
    merges_.reserve(merges);
  }
  void AddToken(std::string key, int32_t id);
  // A merge "left right" (keys as in AddToken) of rank `rank`; false when a
  // part or the merged token is not in the vocabulary.
  bool AddMerge(std::string_view left, std::string_view right, int32_t rank);
  void Finalize();  // byte-fallback and single-byte tables

  // Scratch reused across words of one Encode call (not thread-shared).
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev, next;
      uint32_t begin, len;  // bytes of the word
    };
    struct Candidate {
      int32_t rank, pos, new_id;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Appends the ids of `word` (non-empty, valid UTF-8).
  absl::Status EncodeWord(std::string_view word, Scratch* scratch, std::vector<int32_t>* out) const;

  const absl::flat_hash_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank, new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  absl::Status InitialSymbols(std::string_view word, Scratch* s) const;
  absl::Status MergeWord(std::string_view word, Scratch* s, std::vector<int32_t>* out) const;

  // Words seen before (natural text repeats most of them): sharded so that
  // concurrent Encode calls rarely meet on a lock; a full shard is cleared.
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words;
  };
  static constexpr int kCacheShards = 16;
  static constexpr size_t kCacheShardWords = 8192;
  static constexpr size_t kCacheMaxWordBytes = 64;
  mutable CacheShard cache_[kCacheShards];

  BpeOptions options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int32_t byte_id_[256];   // byte-level: single-byte token; else the <0xNN> token (-1: none)
  int32_t ascii_id_[128];  // character-level: one-character ASCII tokens (-1: none)
};

}  // namespace fusedserve::tokenizer
