// KV cache block allocator (see block_allocator.h).
#include "engine/block_allocator.h"

namespace fusedserve {

KvBlockAllocator::KvBlockAllocator(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  free_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

bool KvBlockAllocator::EnsureCapacity(std::vector<int32_t>* table, int64_t positions) {
  const int64_t need = BlocksFor(positions) - static_cast<int64_t>(table->size());
  if (need <= 0) return true;
  if (need > num_free()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvBlockAllocator::Free(std::vector<int32_t>* table) {
  for (auto it = table->rbegin(); it != table->rend(); ++it) free_.push_back(*it);
  table->clear();
}

}  // namespace fusedserve
