// Small LLaMA configs for the GPU tests of the model runner: big enough to
// use the tensor-core paths (bf16, head dim 64, GQA 4), small enough to run
// in seconds.
#pragma once

#include "kernels/dtype.h"
#include "model/config.h"

namespace fusedserve {

inline ModelConfig MidConfig() {
  ModelConfig c;
  c.name = "mid";
  c.hidden = 512;
  c.layers = 4;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.intermediate = 1536;
  c.vocab = 2048;
  c.max_position = 4096;
  c.dtype = DType::kBF16;
  return c;
}

}  // namespace fusedserve
