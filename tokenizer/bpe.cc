// BPE merges by rank (Hugging Face's Word::merge_all).
#include "tokenizer/bpe.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tokenizer/sv.h"
#include "tokenizer/utf8.h"

namespace fusedserve::tokenizer {

void BpeModel::AddToken(std::string key, int32_t id) { vocab_.emplace(std::move(key), id); }

bool BpeModel::AddMerge(std::string_view left, std::string_view right, int32_t rank) {
  auto l = vocab_.find(SV(left)), r = vocab_.find(SV(right));
  if (l == vocab_.end() || r == vocab_.end()) return false;
  auto m = vocab_.find(absl::StrCat(SV(left), SV(right)));
  if (m == vocab_.end()) return false;
  // A repeated pair keeps its last rank, as Hugging Face's HashMap collect does.
  merges_[PairKey(l->second, r->second)] = Merge{rank, m->second};
  return true;
}

void BpeModel::Finalize() {
  for (int b = 0; b < 256; ++b) {
    const std::string key = options_.byte_level ? std::string(1, static_cast<char>(b)) : absl::StrFormat("<0x%02X>", b);
    auto it = vocab_.find(key);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  for (int c = 0; c < 128; ++c) {
    auto it = vocab_.find(std::string(1, static_cast<char>(c)));
    ascii_id_[c] = it == vocab_.end() ? -1 : it->second;
  }
}

absl::Status BpeModel::InitialSymbols(std::string_view word, Scratch* s) const {
  auto& syms = s->symbols;
  syms.clear();
  auto add = [&](int32_t id, size_t begin, size_t len) {
    const int32_t n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, n + 1, static_cast<uint32_t>(begin), static_cast<uint32_t>(len)});
  };
  if (options_.byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      const int32_t id = byte_id_[static_cast<uint8_t>(word[i])];
      if (id < 0) {
        if (options_.unk_id < 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "tokenizer: byte 0x%02X has no token in the byte-level vocabulary and the model has no unk_token",
              static_cast<uint8_t>(word[i])));
        }
        add(options_.unk_id, i, 1);
        continue;
      }
      add(id, i, 1);
    }
  } else {
    // Characters; an unknown one becomes its <0xNN> byte tokens (byte
    // fallback) or the unk token, consecutive unks fused when fuse_unk.
    int32_t unk_begin = -1, unk_len = 0;
    auto flush_unk = [&] {
      if (unk_begin >= 0) add(options_.unk_id, unk_begin, unk_len);
      unk_begin = -1;
      unk_len = 0;
    };
    for (size_t i = 0; i < word.size();) {
      const uint8_t b = static_cast<uint8_t>(word[i]);
      const size_t n = Utf8CharLen(b);
      int32_t id = -1;
      if (b < 0x80) {
        id = ascii_id_[b];
      } else {
        auto it = vocab_.find(SV(word.substr(i, n)));
        if (it != vocab_.end()) id = it->second;
      }
      if (id >= 0) {
        flush_unk();
        add(id, i, n);
        i += n;
        continue;
      }
      if (options_.byte_fallback) {
        bool all = true;
        for (size_t k = 0; k < n; ++k) all = all && byte_id_[static_cast<uint8_t>(word[i + k])] >= 0;
        if (all) {
          // Hugging Face adds the byte tokens without first flushing a
          // pending unk (it comes after them); kept for equality.
          for (size_t k = 0; k < n; ++k) add(byte_id_[static_cast<uint8_t>(word[i + k])], i + k, 1);
          i += n;
          continue;
        }
      }
      if (options_.unk_id < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer: the character '", SV(word.substr(i, n)),
                         "' has no token and the model has neither byte_fallback nor unk_token"));
      }
      if (unk_begin >= 0 && options_.fuse_unk) {
        unk_len += n;
      } else {
        flush_unk();
        unk_begin = static_cast<int32_t>(i);
        unk_len = static_cast<int32_t>(n);
      }
      i += n;
    }
    flush_unk();
  }
  if (!syms.empty()) syms.back().next = -1;
  return absl::OkStatus();
}

absl::Status BpeModel::EncodeWord(std::string_view word, Scratch* s, std::vector<int32_t>* out) const {
  if (options_.ignore_merges) {
    auto it = vocab_.find(SV(word));
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return absl::OkStatus();
    }
  }
  if (word.size() > kCacheMaxWordBytes) return MergeWord(word, s, out);
  const size_t hash = absl::Hash<absl::string_view>()(SV(word));
  CacheShard& shard = cache_[hash % kCacheShards];
  {
    absl::MutexLock lock(&shard.mu);
    auto it = shard.words.find(SV(word));
    if (it != shard.words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  const size_t before = out->size();
  if (absl::Status st = MergeWord(word, s, out); !st.ok()) return st;
  absl::MutexLock lock(&shard.mu);
  if (shard.words.size() >= kCacheShardWords) shard.words.clear();
  shard.words.emplace(std::string(word), std::vector<int32_t>(out->begin() + before, out->end()));
  return absl::OkStatus();
}

absl::Status BpeModel::MergeWord(std::string_view word, Scratch* s, std::vector<int32_t>* out) const {
  if (absl::Status st = InitialSymbols(word, s); !st.ok()) return st;
  auto& syms = s->symbols;
  auto& heap = s->heap;
  heap.clear();
  // Min-heap on (rank, pos).
  auto later = [](const Scratch::Candidate& a, const Scratch::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto push_pair = [&](int32_t pos) {
    const int32_t next = syms[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(syms[pos].id, syms[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.new_id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Scratch::Candidate top = heap.back();
    heap.pop_back();
    Scratch::Symbol& left = syms[top.pos];
    if (left.len == 0 || left.next < 0) continue;  // merged away
    Scratch::Symbol& right = syms[left.next];
    // Stale entry: the pair at pos changed since it was queued.
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) syms[left.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0 && i < static_cast<int32_t>(syms.size()); i = syms[i].next) out->push_back(syms[i].id);
  return absl::OkStatus();
}

}  // namespace fusedserve::tokenizer
