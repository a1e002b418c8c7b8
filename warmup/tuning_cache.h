// The persisted tuning cache: tuned kernel configs keyed by (op, dtype, shape
// bucket), kept in one JSON file that several replicas may share on a volume.
//
// File layout (schema 1):
//   {"format": "fusedserve-tuning-cache", "schema": 1,
//    "sections": [
//      {"stamp": {"device": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
//                 "driver": 13000, "cuda_runtime": 13000, "cublaslt": 130000,
//                 "kernel_hash": "..."},
//       "updated": "2025-01-01T00:00:00Z",
//       "entries": [{"op": "rms_norm", "dtype": "bf16", "key": [4096, 4096],
//                    "config": "t256.r1.v8", "time_us": 26.1,
//                    "runner_up": "t128.r1.v8", "runner_up_us": 27.0,
//                    "default_us": 29.0, "candidates": 9}, ...]}]}
// One section per stamp: a process reads and writes only the section whose
// stamp equals its own and carries the others over untouched. That is what
// "a foreign file is not used but kept" means when replicas of two builds (a
// rolling update) or two GPU models share one volume: neither destroys the
// other's tuning, and neither ping-pongs the file. At most kMaxForeignSections
// other sections are kept (the most recently updated).
//
// Concurrency: every read-modify-write holds an exclusive flock on
// "<path>.lock" (never deleted), re-reads the file, merges the entries others
// wrote since, and replaces the file atomically (temp file in the same
// directory, fsync, rename, fsync of the directory). Readers without the lock
// only ever see a complete old or new file.
//
// Failure policy (none of these is an error to the caller):
//   file read but not parseable -> renamed to "<path>.corrupt-<UTC time>", rebuilt (state "corrupt")
//   file there but not readable (permission denied, a directory, a FIFO or
//   device, larger than kMaxTuningCacheBytes, an I/O error)
//                               -> left untouched, never written; configs kept in
//                                  memory, one warning (state "unreadable"): a
//                                  valid cache one replica cannot read is not
//                                  destroyed for every replica
//   schema from another version -> not used, never written (state "foreign")
//   no section for this stamp   -> state "foreign"; our section is added on write
//   read-only / full volume     -> configs kept in memory, one warning (state "read_only")
//   "<path>.lock" not a regular file (a symbolic link, FIFO...) -> never followed or
//                                  created through; no writes, as for a read-only volume
// Files are opened with warmup/regular_file.h, so a FIFO or device at the
// path never blocks start-up.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kernels/dtype.h"

namespace fusedserve {

inline constexpr int kTuningCacheSchema = 1;
inline constexpr int kMaxForeignSections = 7;
// Largest cache file read (parsing costs ~10x its size in memory). A real
// cache holds a few hundred entries of ~250 bytes per stamp: well under 1 MiB.
// A larger file is left untouched (state "unreadable"), and a merge that
// would exceed it is not written.
inline constexpr int64_t kMaxTuningCacheBytes = int64_t{64} << 20;

// What tuned configs are valid for: the same device, driver, libraries and
// kernel build. Configs are only reused when every field is equal.
struct CacheStamp {
  std::string device;              // GPU name, or "cpu"
  std::string compute_capability;  // "9.0"; "" without a GPU
  int64_t driver = 0;              // cudaDriverGetVersion
  int64_t cuda_runtime = 0;        // cudaRuntimeGetVersion
  int64_t cublaslt = 0;            // cublasLtGetVersion
  std::string kernel_hash;         // FUSEDSERVE_KERNEL_HASH of the build

  bool operator==(const CacheStamp& o) const {
    return device == o.device && compute_capability == o.compute_capability && driver == o.driver &&
           cuda_runtime == o.cuda_runtime && cublaslt == o.cublaslt && kernel_hash == o.kernel_hash;
  }
  bool operator!=(const CacheStamp& o) const { return !(*this == o); }
  std::string ToString() const;  // one line, for logs
};

// One tuned (op, dtype, bucket).
struct TuningEntry {
  std::string op;
  DType dtype = DType::kBF16;
  std::vector<int64_t> key;  // bucketed (BucketKey)
  std::string config;        // the winner; "" = the op's default (nothing to tune)
  double time_us = 0;        // the winner's median time; 0 when nothing was timed
  std::string runner_up;     // "" when there was no other accepted candidate
  double runner_up_us = 0;
  double default_us = 0;   // the default config's time, for the speed-up
  int64_t candidates = 0;  // candidate configs considered
};

// Smallest power of two >= n (1 for n <= 1).
int64_t RoundUpPow2(int64_t n);
// The cache key of a TuningKey: the op's bucket_dims rounded up to a power of
// two (the token dim; attention_decode's context length too, since decode
// runs at every length). Other dims exact.
std::vector<int64_t> BucketKey(const std::string& op, const std::vector<int64_t>& key);
// "rms_norm|bf16|4096,4096" (key already bucketed).
std::string EntryId(const std::string& op, DType dtype, const std::vector<int64_t>& key);
// Lower-case dtype names used in the cache and envelope files: "bf16", "f16", "f32".
std::string DTypeFileName(DType dtype);
bool ParseDTypeFileName(const std::string& name, DType* dtype);  // also accepts "BF16" etc.

class TuningCache {
 public:
  // Never fails: problems set state() and queue notices. path "" disables persistence.
  static std::unique_ptr<TuningCache> Open(std::string path, CacheStamp stamp);

  // Loads again for another stamp (the warm-up found a different device).
  void Reopen(CacheStamp stamp);

  // "loaded", "created", "foreign", "corrupt", "unreadable", "disabled" or "read_only".
  std::string state() const;
  const std::string& path() const { return path_; }
  CacheStamp stamp() const;

  // Exact bucketed key.
  std::optional<TuningEntry> Find(const std::string& op, DType dtype, const std::vector<int64_t>& bucketed) const;
  // Any TuningKey: buckets it; "" when absent (the op's default).
  std::string LookupConfig(const std::string& op, DType dtype, const std::vector<int64_t>& key) const;
  // Stores (memory) and marks the entry for the next Flush.
  void Put(TuningEntry entry);
  // Drops an entry from memory only (a cached config that failed to run).
  void Forget(const std::string& op, DType dtype, const std::vector<int64_t>& bucketed);
  int64_t size() const;
  std::vector<TuningEntry> entries() const;

  // Writes the entries Put since the last Flush, merged with what others
  // wrote. true when the file is up to date (or nothing needed writing);
  // false when it could not be written (state becomes "read_only" once, with
  // one warning; later calls return false without trying).
  bool Flush();
  // Merges entries other processes have written since (no write).
  void Refresh();

  // Log lines (warnings, state changes) since the last call.
  std::vector<std::string> TakeNotices();
  // Reasons the file (or part of it) was not used or not written, with counts:
  // "stale" (foreign stamp or schema), "corrupt" (read, not parseable),
  // "unreadable" (there but not readable: left alone), "unwritable".
  std::vector<std::pair<std::string, int64_t>> rejected() const;

 private:
  TuningCache(std::string path, CacheStamp stamp) : path_(std::move(path)), stamp_(std::move(stamp)) {}
  void Load() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  void CountRejected(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A file at the path that cannot be read: left alone, never written.
  void MarkUnreadable(const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex io_mu_;  // serialises file I/O of this object (held while mu_ is taken, never the reverse)
  mutable absl::Mutex mu_;
  // Bumped on every change of entries_ (under mu_): LookupConfig's per-thread memo.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { version_.fetch_add(1, std::memory_order_release); }
  std::atomic<uint64_t> version_{1};
  const uint64_t id_ = NextCacheId();  // this object's, never reused (memo keys)
  static uint64_t NextCacheId() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1);
  }
  CacheStamp stamp_ ABSL_GUARDED_BY(mu_);
  std::string state_ ABSL_GUARDED_BY(mu_) = "created";
  bool writable_ ABSL_GUARDED_BY(mu_) = true;
  std::unordered_map<std::string, TuningEntry> entries_ ABSL_GUARDED_BY(mu_);
  // Entries Put since the last Flush, with the generation of their last Put.
  std::unordered_map<std::string, uint64_t> dirty_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> notices_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, int64_t>> rejected_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fusedserve
