// KV cache block allocator: the cache is num_blocks fixed-size blocks of
// block_size positions; each sequence owns a block table (list of block ids)
// that grows one block at a time as it generates. Only the engine thread
// touches it; the gauge is read by the metrics.
#pragma once

#include <cstdint>
#include <vector>

namespace fusedserve {

class KvBlockAllocator {
 public:
  KvBlockAllocator(int64_t num_blocks, int64_t block_size);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used() const { return num_blocks_ - num_free(); }
  // Blocks needed to hold `positions` positions.
  int64_t BlocksFor(int64_t positions) const { return (positions + block_size_ - 1) / block_size_; }

  // Grows `table` until it covers `positions` positions. All or nothing:
  // returns false (table unchanged) when not enough blocks are free.
  bool EnsureCapacity(std::vector<int32_t>* table, int64_t positions);
  // Returns every block of `table` to the free list and clears it.
  void Free(std::vector<int32_t>* table);

 private:
  const int64_t num_blocks_;
  const int64_t block_size_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first
};

}  // namespace fusedserve
