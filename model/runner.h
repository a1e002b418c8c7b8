// ModelRunner: the device side of the hosted model. The engine owns the
// scheduling (which sequences run, their KV block tables); a runner owns the
// weights and the KV cache storage and runs one forward step over a batch of
// sequences. The CPU runner (cpu_runner.cc, plain loops on the CPU
// reference ops) is the oracle and the fallback; a CUDA runner (device
// weights, the project's kernels, CUDA-graph decode steps) plugs in here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"
#include "model/weights.h"

namespace fusedserve {

// One sequence's part of a forward step: `num_tokens` new tokens at positions
// [start, start + num_tokens); the KV cache already holds positions [0, start).
// The block table covers at least start + num_tokens positions; position p
// lives in block block_table[p / block_size], row p % block_size.
struct SeqForward {
  const int32_t* tokens = nullptr;  // [num_tokens]
  int64_t num_tokens = 0;
  int64_t start = 0;
  const int32_t* block_table = nullptr;  // [num_blocks]
  int64_t num_blocks = 0;
  // The sequence's logits row is needed (sampling); greedy sequences need
  // only the argmax, which a GPU runner finds without copying the row out.
  bool want_logits = true;
};

// What one forward step returns for each sequence of the batch.
struct ForwardOutput {
  // [B] argmax of each sequence's last-token logits, lowest index among ties.
  std::vector<int32_t> greedy;
  // [B, vocab] when some sequence wants logits (other rows unset), else empty.
  std::vector<float> logits;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  // "cpu" or "cuda".
  virtual std::string device() const = 0;

  // Bytes of K and V one cache block holds over all layers (fp32 here; the
  // CUDA runner's cache is in the model dtype).
  virtual int64_t KvBytesPerBlock(int64_t block_size) const;
  // Allocates the paged KV cache: num_blocks blocks of block_size positions.
  virtual absl::Status InitKvCache(int64_t num_blocks, int64_t block_size) = 0;

  // Runs every layer over the batch (causal; prefill chunks and single decode
  // tokens mixed), writes the new K/V into the cache and returns, for each
  // sequence's last new token, the greedy token and (where wanted) the logits.
  virtual absl::Status Forward(const std::vector<SeqForward>& batch, ForwardOutput* out) = 0;
  // Forward with every logits row: logits [batch.size(), vocab].
  absl::Status ForwardLogits(std::vector<SeqForward> batch, std::vector<float>* logits);

  // TransformerBlock: layers [first, first + n) over B whole sequences of S
  // tokens, causal within each sequence, no cache kept.
  // hidden [B,S,D] (updated in place); positions [B,S]
  virtual absl::Status RunLayers(int64_t first, int64_t n, int64_t B, int64_t S, const int64_t* positions,
                                 float* hidden) = 0;

  // TransformerBlock in pieces through the KV cache: layers [first, first + n)
  // over the batch's rows (hidden [T,D] in place, T = the sum of num_tokens;
  // positions [T] are the rope positions). Row i of a sequence is its index
  // start + i: its K/V go to that cache slot of layers [first, first + n) and
  // it attends to indices [0, start + i], whose K/V earlier calls wrote. So a
  // block call cut into row chunks gives the result of RunLayers.
  // tokens and want_logits are unused. Only where SupportsLayersChunked().
  virtual bool SupportsLayersChunked() const { return false; }
  virtual absl::Status RunLayersChunked(int64_t first, int64_t n, const std::vector<SeqForward>& batch,
                                        const int64_t* positions, float* hidden);
};

// The CPU runner: weights converted to fp32 once, KV cache in fp32.
// `threads` parallelises the GEMMs (0 = hardware concurrency).
// tensor_parallel > 1 holds and runs the model as that many tensor-parallel
// shards in turn (model/tensor_parallel.h): the same results, as a check of
// the sharding; it is not faster.
absl::StatusOr<std::unique_ptr<ModelRunner>> MakeCpuModelRunner(std::unique_ptr<ModelWeights> weights, int threads = 1,
                                                                int tensor_parallel = 1);

}  // namespace fusedserve
