// Tensor-parallel shard ranges (see tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fusedserve {

absl::StatusOr<TensorShard> ShardOf(const ModelConfig& c, int rank, int size) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("--tensor_parallel must be >= 1 (got ", size, ")"));
  if (rank < 0 || rank >= size) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", size));
  // Each rank needs whole kv heads with their query-head groups.
  if (c.kv_heads % size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel=", size, " does not divide the model's ", c.kv_heads, " key/value heads"));
  }
  if (c.intermediate % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor_parallel=", size, " does not divide the model's ",
                                                   "intermediate size ", c.intermediate));
  }
  TensorShard s;
  s.rank = rank;
  s.size = size;
  s.kv_heads = c.kv_heads / size;
  s.kv_head_begin = rank * s.kv_heads;
  s.q_heads = c.q_heads / size;
  s.q_head_begin = rank * s.q_heads;
  s.inter = c.intermediate / size;
  s.inter_begin = rank * s.inter;
  // Vocabulary rows: ceil(vocab / size) each, the last rank the rest.
  const int64_t per = (c.vocab + size - 1) / size;
  s.vocab_begin = std::min<int64_t>(c.vocab, rank * per);
  s.vocab = std::min<int64_t>(c.vocab, s.vocab_begin + per) - s.vocab_begin;
  return s;
}

LayerBlocks LayerShardBlocks(const ModelConfig& c, const TensorShard& r, int64_t layer) {
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  const int64_t D = c.hidden, Dh = c.head_dim;
  LayerBlocks b;
  b.qkv = {{p + "self_attn.q_proj.weight", r.q_head_begin * Dh, r.q_heads * Dh, 0, D},
           {p + "self_attn.k_proj.weight", r.kv_head_begin * Dh, r.kv_heads * Dh, 0, D},
           {p + "self_attn.v_proj.weight", r.kv_head_begin * Dh, r.kv_heads * Dh, 0, D}};
  b.gate_up = {{p + "mlp.gate_proj.weight", r.inter_begin, r.inter, 0, D},
               {p + "mlp.up_proj.weight", r.inter_begin, r.inter, 0, D}};
  b.o = {p + "self_attn.o_proj.weight", 0, D, r.q_head_begin * Dh, r.q_heads * Dh};
  b.down = {p + "mlp.down_proj.weight", 0, D, r.inter_begin, r.inter};
  return b;
}

ModelConfig ShardConfig(ModelConfig config, const TensorShard& shard) {
  config.q_heads = shard.q_heads;
  config.kv_heads = shard.kv_heads;
  config.intermediate = shard.inter;
  return config;
}

}  // namespace fusedserve
