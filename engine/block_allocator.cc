// KV cache block allocator (see block_allocator.h).
#include "engine/block_allocator.h"

#include <algorithm>
#include <limits>

namespace fusedserve {

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int64_t block_size, bool prefix_caching)
    : num_blocks_(num_blocks), block_size_(block_size), prefix_caching_(prefix_caching), blocks_(num_blocks) {
  free_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::size_t KvBlockAllocator::KeyHash::operator()(const Key& k) const {
  // FNV-1a over the chain link and the tokens; equality decides a match.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  mix(static_cast<uint64_t>(static_cast<uint32_t>(k.parent)));
  mix(k.parent_generation);
  for (int32_t t : k.tokens) mix(static_cast<uint32_t>(t));
  return static_cast<std::size_t>(h);
}

KvBlockAllocator::Key KvBlockAllocator::KeyFor(int32_t parent, const int32_t* tokens) const {
  Key k;
  k.parent = parent;
  k.parent_generation = parent >= 0 ? blocks_[parent].generation : 0;
  k.tokens.assign(tokens, tokens + block_size_);
  return k;
}

int32_t KvBlockAllocator::Take() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    // Evict the least recently released cached block.
    id = evictable_.front();
    evictable_.pop_front();
    Block& b = blocks_[id];
    published_.erase(b.key);
    b.published = false;
    b.key = Key{};
  }
  // New content: keys naming this block under its old generation go stale.
  ++blocks_[id].generation;
  blocks_[id].refs = 1;
  return id;
}

bool KvBlockAllocator::EnsureCapacity(std::vector<int32_t>* table, int64_t positions) {
  const int64_t need = BlocksFor(positions) - static_cast<int64_t>(table->size());
  if (need <= 0) return true;
  if (need > num_free()) return false;
  for (int64_t i = 0; i < need; ++i) table->push_back(Take());
  return true;
}

void KvBlockAllocator::Free(std::vector<int32_t>* table) {
  // Last block first: a chain's tail is released, so evicted, before its head.
  for (auto it = table->rbegin(); it != table->rend(); ++it) {
    Block& b = blocks_[*it];
    if (b.refs == 2) --shared_;
    if (--b.refs > 0) continue;
    if (b.published) {
      b.lru = evictable_.insert(evictable_.end(), *it);
    } else {
      free_.push_back(*it);
    }
  }
  table->clear();
}

int64_t KvBlockAllocator::MatchPrefix(const int32_t* tokens, int64_t max_positions, std::vector<int32_t>* table) {
  if (!prefix_caching_ || !table->empty()) return 0;
  int32_t parent = -1;
  int64_t n = 0;
  while (n + block_size_ <= max_positions) {
    auto it = published_.find(KeyFor(parent, tokens + n));
    if (it == published_.end()) break;
    Block& b = blocks_[it->second];
    if (b.refs == 0) evictable_.erase(b.lru);
    if (b.refs == 1) ++shared_;
    ++b.refs;
    table->push_back(it->second);
    parent = it->second;
    n += block_size_;
  }
  return n;
}

void KvBlockAllocator::Publish(const int32_t* tokens, int64_t written, const std::vector<int32_t>& table,
                               int64_t* published) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(written / block_size_, static_cast<int64_t>(table.size()));
  for (int64_t i = *published; i < full; ++i) {
    const int32_t id = table[i];
    Block& b = blocks_[id];
    if (b.published) continue;
    Key key = KeyFor(i > 0 ? table[i - 1] : -1, tokens + i * block_size_);
    if (!published_.emplace(key, id).second) {
      // Another sequence published this content first: lookups follow its
      // block, so the rest of this chain could never be matched.
      *published = std::numeric_limits<int64_t>::max();
      return;
    }
    b.key = std::move(key);
    b.published = true;
  }
  *published = std::max(*published, full);
}

}  // namespace fusedserve
