// Model weights: a Hugging Face checkpoint directory (config.json plus
// model.safetensors, or shards listed in model.safetensors.index.json),
// memory-mapped and validated against the config, or random weights from a
// seed for a built-in preset. Tensors keep the checkpoint's dtype and bytes;
// each runner converts or uploads them as it needs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/config.h"

namespace fusedserve {

// Caps on checkpoint files, checked before they are parsed or mapped.
// The JSON header of a safetensors file holds ~150 bytes per tensor (well under
// 1 MiB for real shards) and parsing it costs ~10x its size in memory.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = int64_t{16} << 20;
// model.safetensors.index.json: one line per tensor, likewise small.
inline constexpr int64_t kMaxSafetensorsIndexBytes = int64_t{16} << 20;
// Shards are mapped, not read, so this only refuses sizes no real shard has.
inline constexpr int64_t kMaxSafetensorsFileBytes = int64_t{1} << 40;  // 1 TiB

// A view of one tensor's bytes (inside a mapped file or an owned buffer).
struct WeightTensor {
  std::string dtype_name;  // safetensors name: "BF16", "F16", "F32", "I64", ...
  bool is_float = false;   // F32, F16 or BF16 (dtype below is meaningful)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t bytes = 0;

  int64_t numel() const;
  // Values converted to fp32 (only for is_float tensors).
  std::vector<float> ToFloat() const;
  // Rows [row, row + rows) x columns [col, col + cols) of a 2-D tensor, in
  // fp32: a tensor-parallel shard, converted without a full copy.
  std::vector<float> ToFloatBlock(int64_t row, int64_t rows, int64_t col, int64_t cols) const;
};

// One memory-mapped .safetensors file: 8-byte little-endian header length,
// the JSON header ({name: {dtype, shape, data_offsets}}), then the data.
class SafetensorsFile {
 public:
  // Opens the file (a regular file: a FIFO or device is refused, not blocked
  // on), maps it and checks the header: at most kMaxSafetensorsHeaderBytes,
  // offsets in range, consistent with dtype x shape and not overlapping
  // another tensor's bytes. Errors name the file and the tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, WeightTensor>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, WeightTensor> tensors_;
};

// The tensors a LLaMA checkpoint must hold, with their shapes, in HF names
// (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ...).
std::vector<std::pair<std::string, std::vector<int64_t>>> ExpectedTensors(const ModelConfig& config);

class ModelWeights {
 public:
  // Loads config.json and the safetensors of a checkpoint directory and
  // validates them: every expected tensor present with its shape and a float
  // dtype, no unexpected tensor. Errors name the tensor and the file.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> LoadCheckpoint(const std::string& dir);
  // Validates already opened files against a config (LoadCheckpoint's second half).
  static absl::StatusOr<std::unique_ptr<ModelWeights>> FromFiles(ModelConfig config,
                                                                 std::vector<std::unique_ptr<SafetensorsFile>> files);
  // Random weights in config.dtype: linear weights uniform with std
  // 1/sqrt(fan_in), embeddings std 1, norm weights 1. Same seed -> same weights.
  static std::unique_ptr<ModelWeights> Random(const ModelConfig& config, uint64_t seed);

  const ModelConfig& config() const { return config_; }
  // A validated tensor by HF name; must be one of ExpectedTensors.
  const WeightTensor& Get(const std::string& name) const { return tensors_.at(name); }
  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }

 private:
  ModelWeights() = default;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::string> owned_;  // buffers of random weights
  std::map<std::string, WeightTensor> tensors_;
};

}  // namespace fusedserve
