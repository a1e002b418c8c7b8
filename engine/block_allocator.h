// KV cache block allocator: the cache is num_blocks fixed-size blocks of
// block_size positions; each sequence owns a block table (list of block ids)
// that grows one block at a time as it generates.
//
// Prefix caching: a full block whose K/V are written can be published under
// its content, which is the exact chain (parent block, its tokens). A later
// sequence whose tokens start the same way shares those blocks (reference
// counted) and prefills only the rest. A published block that no sequence
// holds stays cached, evictable: allocation takes never-cached free blocks
// first, then the least recently released cached one. Because K/V at a
// position depend on every earlier token and on the position only, an exact
// chain match gives the same K/V; the key is compared exactly, never a hash
// alone. Only the engine thread touches it; the gauges are read by the metrics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace fusedserve {

class KvBlockAllocator {
 public:
  KvBlockAllocator(int64_t num_blocks, int64_t block_size, bool prefix_caching = false);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks an allocation can take: never-used free blocks and evictable cached ones.
  int64_t num_free() const { return static_cast<int64_t>(free_.size() + evictable_.size()); }
  // Blocks some sequence holds.
  int64_t num_used() const { return num_blocks_ - num_free(); }
  // Published blocks no sequence holds (kept for reuse, evicted on demand).
  int64_t num_cached_idle() const { return static_cast<int64_t>(evictable_.size()); }
  // Blocks held by more than one sequence (prefix sharing at work).
  int64_t num_shared() const { return shared_; }
  // Blocks needed to hold `positions` positions.
  int64_t BlocksFor(int64_t positions) const { return (positions + block_size_ - 1) / block_size_; }

  // Grows `table` until it covers `positions` positions. All or nothing:
  // returns false (table unchanged) when not enough blocks are free.
  bool EnsureCapacity(std::vector<int32_t>* table, int64_t positions);
  // Releases every block of `table` and clears it.
  void Free(std::vector<int32_t>* table);

  // Prefix caching (no-op without it): appends to the empty `table` the
  // longest run of published blocks that holds tokens[0, n) for n <=
  // max_positions, and returns n (a multiple of block_size).
  int64_t MatchPrefix(const int32_t* tokens, int64_t max_positions, std::vector<int32_t>* table);
  // Publishes the full blocks of `table` that hold tokens[0, written)
  // (their K/V are in the cache), starting after the first *published
  // blocks, which it advances. A block whose content is already published
  // by another block stays private.
  void Publish(const int32_t* tokens, int64_t written, const std::vector<int32_t>& table, int64_t* published);

 private:
  // A published block's content: its parent (the block before it in the
  // chain, -1 for the first, with that block's reuse generation) and tokens.
  struct Key {
    int32_t parent = -1;
    uint64_t parent_generation = 0;
    std::vector<int32_t> tokens;
    bool operator==(const Key& o) const {
      return parent == o.parent && parent_generation == o.parent_generation && tokens == o.tokens;
    }
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const;
  };
  struct Block {
    int32_t refs = 0;
    uint64_t generation = 0;  // bumped when the block is reused for other content
    bool published = false;
    Key key;
    std::list<int32_t>::iterator lru;  // position in evictable_ while refs == 0 and published
  };

  int32_t Take();  // one block for new content (caller checked num_free)
  Key KeyFor(int32_t parent, const int32_t* tokens) const;

  const int64_t num_blocks_;
  const int64_t block_size_;
  const bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;     // never published or dropped: LIFO, recently freed reused first
  std::list<int32_t> evictable_;  // published, unreferenced: front = least recently released
  std::unordered_map<Key, int32_t, KeyHash> published_;
  int64_t shared_ = 0;  // blocks with refs >= 2
};

}  // namespace fusedserve
