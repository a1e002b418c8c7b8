// Megatron-style tensor parallelism: which part of the model rank r of N
// holds. Column-parallel projections (q/k/v by heads, gate/up by
// intermediate columns) need no communication; the row-parallel o_proj and
// down_proj each leave a partial sum per rank that one all-reduce per
// projection adds up; embeddings and lm_head are split by vocabulary rows
// (a lookup is the owning rank's row; logits are gathered). Each rank owns
// its kv heads' slice of the paged KV cache.
//
// The CPU runner runs all N ranks in one process with an in-process
// reduction in rank order, which must match the unsharded runner: the check
// of the sharding that needs no GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"

namespace fusedserve {

struct TensorShard {
  int rank = 0;
  int size = 1;
  int64_t q_head_begin = 0, q_heads = 0;    // query heads [begin, begin + n)
  int64_t kv_head_begin = 0, kv_heads = 0;  // kv heads (each serves its own q heads' group)
  int64_t inter_begin = 0, inter = 0;       // MLP intermediate columns
  int64_t vocab_begin = 0, vocab = 0;       // embedding / lm_head rows
};

// Rank `rank` of `size`. INVALID_ARGUMENT (naming --tensor_parallel) when
// the model does not split that way: kv heads and the intermediate size
// must divide by size (q heads then do, as a multiple of kv heads).
absl::StatusOr<TensorShard> ShardOf(const ModelConfig& config, int rank, int size);

// Where a rank's part of a weight lies in the checkpoint's [out, in]
// matrix: rows [row, row + rows) x columns [col, col + cols).
struct WeightBlock {
  std::string name;
  int64_t row = 0, rows = 0, col = 0, cols = 0;
};
// A rank's blocks of layer `layer`, in the order the runners concatenate
// them. Column-parallel (rows of its heads / intermediate columns): qkv =
// [q; k; v], gate_up = [gate; up]. Row-parallel (the input columns those
// produce): o_proj, down_proj.
struct LayerBlocks {
  std::vector<WeightBlock> qkv, gate_up;
  WeightBlock o, down;
};
LayerBlocks LayerShardBlocks(const ModelConfig& config, const TensorShard& shard, int64_t layer);

// The model as one rank sees it: the shard's q/kv heads and intermediate
// size (hidden, vocab and the rest unchanged): its kernels' shapes.
ModelConfig ShardConfig(ModelConfig config, const TensorShard& shard);

}  // namespace fusedserve
