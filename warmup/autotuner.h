// The autotuner seam. A Tuner times the candidate configs of one envelope
// entry on a device and launches an entry's kernel once for warm-up; the
// TuningService (warmup.cc) owns the cache, the budget and the log lines.
// The CUDA tuner lives in autotuner_cuda.cc (built with FUSEDSERVE_HAVE_CUDA);
// tests substitute their own Tuner through CreateTuningService.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "warmup/tuning_cache.h"
#include "warmup/warmup.h"

namespace fusedserve {

struct CandidateTime {
  std::string config;
  double us = 0;  // median time
};

struct TuneResult {
  // false: the device has no kernel for this op (nothing timed, nothing stored).
  bool supported = true;
  std::string note;                     // why not supported / skipped, for the log
  std::string default_config;           // the first candidate; "" when the op has none
  int64_t candidates = 0;               // candidate configs listed
  int64_t benchmarks = 0;               // candidate configs timed
  std::vector<CandidateTime> accepted;  // fastest first; includes the default when timed
  double default_us = 0;                // 0 when not timed
  // (config, reason): "mismatch" (output differs from the default config's) or
  // "launch_failed".
  std::vector<std::pair<std::string, std::string>> rejected;
};

class Tuner {
 public:
  virtual ~Tuner() = default;
  // Whether this tuner's device is the one `backend` runs on (tuning for a
  // CPU backend would time kernels that are never used).
  virtual bool Serves(const Backend* backend) const = 0;
  // What the configs it tunes are valid for (the current device).
  virtual CacheStamp Stamp() const = 0;
  // Times every candidate of entry (key already bucketed). `tuned` resolves the
  // configs of other ops a fused op may call into. An error means the device
  // is unusable (e.g. a sticky CUDA error); a bad candidate is only rejected.
  virtual absl::StatusOr<TuneResult> Tune(const EnvelopeEntry& entry, const ConfigLookup& tuned) = 0;
  // Launches entry's kernel once with config ("" = default) on zero inputs so
  // its module is loaded. Unimplemented when the device has no kernel for it.
  virtual absl::Status RunOnce(const EnvelopeEntry& entry, const std::string& config, const ConfigLookup& tuned) = 0;
  // Frees device buffers held between calls (after warm-up).
  virtual void Release() {}
};

// The CUDA tuner for the current device; nullptr in a build without CUDA or
// when no GPU is present.
std::unique_ptr<Tuner> MakeCudaTuner();
// The stamp of a process without a usable GPU (its cache section is never
// filled; it only reads).
CacheStamp HostStamp();
// FUSEDSERVE_KERNEL_HASH, or "dev" when the build did not define it.
const char* KernelBuildHash();

struct TuningServiceInternals {
  // Persist tuned entries at least this often while tuning (and at the end).
  double flush_interval_seconds = 10;
};

// Create() with an explicit stamp and tuner (nullptr: never tune).
absl::StatusOr<std::unique_ptr<TuningService>> CreateTuningService(const WarmupOptions& options, CacheStamp stamp,
                                                                   std::unique_ptr<Tuner> tuner,
                                                                   TuningServiceInternals internals = {});

}  // namespace fusedserve
