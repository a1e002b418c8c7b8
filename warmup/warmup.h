// Start-up warm-up: the persisted tuning cache, the autotuner and the shape
// envelope. The server creates one TuningService at start, hands its lookup()
// to the CUDA backend and its counted_lookup() to the CUDA model runner
// (model/kernel_shapes.h lists the runner's keys, which the envelope
// includes), calls Warmup() before the runner builds its CUDA graphs and
// before reporting SERVING, and never tunes on the request path: a shape
// outside the envelope uses its bucket's cached config if any, else the op's
// default config.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace fusedserve {

// One (op, dtype, TuningKey) the server promises to serve warm.
struct EnvelopeEntry {
  std::string op;
  DType dtype = DType::kBF16;
  std::vector<int64_t> key;  // TuningKey with the token dim already a bucket
};

// The dimensions of a model that set the default envelope's shapes.
struct EnvelopeShape {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
};

struct WarmupOptions {
  std::string cache_path;     // tuning cache JSON file; "" disables persistence
  std::string envelope_path;  // optional JSON envelope file; "" = default envelope
  // The hosted model's own kernels (ModelEnvelope, in its dtype), first in
  // the default envelope. When set with model_shapes, the FusedOp entries are
  // made for model_shapes in `dtype` only, not for the standard dimensions.
  std::vector<EnvelopeEntry> model_entries;
  // Standard envelope dimensions (Llama-3-8B's) when no model is hosted.
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 14336;
  int64_t num_q_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  int64_t vocab_size = 128256;
  DType dtype = DType::kBF16;
  // The hosted model's dimensions (main.cc adds them): FusedOp entries for
  // them, beside the standard ones unless model_entries is set.
  std::vector<EnvelopeShape> model_shapes;
  int64_t max_tokens = 16384;        // token buckets 1, 2, 4, ... max_tokens
  bool tune_missing = true;          // false: use defaults for entries not in the cache
  double tune_budget_seconds = 600;  // stop tuning after this; rest use defaults
};

struct WarmupReport {
  std::string cache_state;  // "loaded", "created", "foreign", "corrupt", "unreadable", "disabled", "read_only"
  int64_t entries = 0;      // entries in the cache after warm-up
  int64_t hits = 0;         // envelope entries found in the cache
  int64_t misses = 0;       // envelope entries tuned (or defaulted) at start
  int64_t benchmarks = 0;   // candidate configs timed
  std::vector<std::pair<std::string, int64_t>> rejected;  // reason -> count
  double seconds = 0;                                     // wall time of Warmup()
};

// What went through counted_lookup(): the distinct (op, dtype, bucket) keys
// asked for and how many of them the cache held.
struct LookupCounts {
  int64_t keys = 0;
  int64_t hits = 0;
  std::vector<std::string> missed;  // EntryId of each key the cache did not hold
};

class TuningService {
 public:
  virtual ~TuningService() = default;
  // Loads the cache (setting aside corrupt/foreign files, never failing on them).
  static absl::StatusOr<std::unique_ptr<TuningService>> Create(const WarmupOptions& options);

  // Thread-safe config lookup for the CUDA backend: (op, dtype, key) -> config
  // string, "" for the default. Buckets the token dim of key.
  virtual ConfigLookup lookup() = 0;
  // lookup() for the model runner: the same configs, and each distinct key
  // asked for is counted (counts()), so the start-up line can say how many of
  // the model's kernels run a tuned config.
  virtual ConfigLookup counted_lookup() = 0;
  virtual LookupCounts counts() const = 0;

  // Tunes the envelope entries missing from the cache (CUDA only; within the
  // budget; one progress line per entry through log), persists the cache, then
  // runs every envelope kernel once through `backend` so the first request
  // pays no lazy initialisation.
  virtual absl::Status Warmup(Backend* backend, const std::function<void(const std::string&)>& log) = 0;

  virtual WarmupReport report() const = 0;
  virtual const std::vector<EnvelopeEntry>& envelope() const = 0;
};

}  // namespace fusedserve
