// Tuning cache file I/O: load with set-aside of corrupt files (unreadable ones
// are left alone), merge under an flock, atomic replace. The file format and failure policy are described in
// tuning_cache.h.
#include "warmup/tuning_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/op.h"
#include "nlohmann/json.hpp"
#include "warmup/regular_file.h"

namespace fusedserve {

using json = nlohmann::json;

// ---- keys ---------------------------------------------------------------------

int64_t RoundUpPow2(int64_t n) {
  int64_t p = 1;
  while (p < n && p < (int64_t{1} << 62)) p <<= 1;
  return p;
}

std::vector<int64_t> BucketKey(const std::string& op, const std::vector<int64_t>& key) {
  static const std::vector<int> kTokenDim = {0};  // an op this build does not know
  const OpSpec* spec = FindOpSpec(op);
  std::vector<int64_t> b = key;
  for (int d : spec != nullptr ? spec->bucket_dims : kTokenDim) {
    if (d < static_cast<int>(b.size())) b[d] = RoundUpPow2(b[d]);
  }
  return b;
}

std::string DTypeFileName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "?";
}

bool ParseDTypeFileName(const std::string& name, DType* dtype) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "bf16" || n == "bfloat16")
    *dtype = DType::kBF16;
  else if (n == "f16" || n == "fp16" || n == "float16")
    *dtype = DType::kF16;
  else if (n == "f32" || n == "fp32" || n == "float32")
    *dtype = DType::kF32;
  else
    return false;
  return true;
}

std::string EntryId(const std::string& op, DType dtype, const std::vector<int64_t>& key) {
  return absl::StrCat(op, "|", DTypeFileName(dtype), "|", absl::StrJoin(key, ","));
}

std::string CacheStamp::ToString() const {
  return absl::StrCat(device, " sm", compute_capability, " driver ", driver, " cuda ", cuda_runtime, " cublasLt ",
                      cublaslt, " kernels ", kernel_hash);
}

namespace {

// ---- JSON <-> structs -------------------------------------------------------------

json StampToJson(const CacheStamp& s) {
  return json{{"device", s.device},     {"compute_capability", s.compute_capability},
              {"driver", s.driver},     {"cuda_runtime", s.cuda_runtime},
              {"cublaslt", s.cublaslt}, {"kernel_hash", s.kernel_hash}};
}

bool StampFromJson(const json& j, CacheStamp* s) {
  if (!j.is_object()) return false;
  auto str = [&](const char* k, std::string* out) {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string()) return false;
    *out = it->get<std::string>();
    return true;
  };
  auto num = [&](const char* k, int64_t* out) {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number_integer()) return false;
    *out = it->get<int64_t>();
    return true;
  };
  return str("device", &s->device) && str("compute_capability", &s->compute_capability) && num("driver", &s->driver) &&
         num("cuda_runtime", &s->cuda_runtime) && num("cublaslt", &s->cublaslt) && str("kernel_hash", &s->kernel_hash);
}

double Round2(double us) { return std::round(us * 100.0) / 100.0; }

json EntryToJson(const TuningEntry& e) {
  json j{{"op", e.op}, {"dtype", DTypeFileName(e.dtype)}, {"key", e.key}, {"config", e.config}};
  j["time_us"] = Round2(e.time_us);
  j["runner_up"] = e.runner_up;
  j["runner_up_us"] = Round2(e.runner_up_us);
  j["default_us"] = Round2(e.default_us);
  j["candidates"] = e.candidates;
  return j;
}

bool EntryFromJson(const json& j, TuningEntry* e, std::string* why) {
  if (!j.is_object()) {
    *why = "an entry is not an object";
    return false;
  }
  auto op = j.find("op"), dtype = j.find("dtype"), key = j.find("key"), config = j.find("config");
  if (op == j.end() || !op->is_string() || op->get<std::string>().empty()) {
    *why = "an entry has no op";
    return false;
  }
  e->op = op->get<std::string>();
  if (dtype == j.end() || !dtype->is_string() || !ParseDTypeFileName(dtype->get<std::string>(), &e->dtype)) {
    *why = "entry " + e->op + " has a bad dtype";
    return false;
  }
  if (key == j.end() || !key->is_array() || key->empty()) {
    *why = "entry " + e->op + " has a bad key";
    return false;
  }
  e->key.clear();
  for (const json& d : *key) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0) {
      *why = "entry " + e->op + " has a bad key";
      return false;
    }
    e->key.push_back(d.get<int64_t>());
  }
  e->key = BucketKey(e->op, e->key);
  if (config == j.end() || !config->is_string()) {
    *why = "entry " + e->op + " has no config";
    return false;
  }
  e->config = config->get<std::string>();
  auto num = [&](const char* k, double* out) {
    auto it = j.find(k);
    if (it != j.end() && it->is_number()) *out = it->get<double>();
  };
  num("time_us", &e->time_us);
  num("runner_up_us", &e->runner_up_us);
  num("default_us", &e->default_us);
  if (auto it = j.find("runner_up"); it != j.end() && it->is_string()) e->runner_up = it->get<std::string>();
  if (auto it = j.find("candidates"); it != j.end() && it->is_number_integer()) e->candidates = it->get<int64_t>();
  return true;
}

std::string UtcNow(const char* format) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string ErrnoText(int err) { return std::strerror(err); }

// ---- files ------------------------------------------------------------------------

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void MakeDirs(const std::string& dir) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (!partial.empty()) mkdir(partial.c_str(), 0755);  // EEXIST and the rest surface when writing
  }
}

// An exclusive flock on "<path>.lock", released on destruction.
class FileLock {
 public:
  ~FileLock() {
    if (fd_ >= 0) {
      flock(fd_, LOCK_UN);
      close(fd_);
    }
  }
  // for_write: the lock file must be creatable (the directory is writable).
  // Otherwise an existing lock file is used read-only, and no lock at all is
  // fine for a reader (files are only ever replaced by rename).
  // The lock file is never followed through a symbolic link (O_NOFOLLOW: a
  // link planted there must not make us create or lock its target) and must be
  // a regular file (O_NONBLOCK: a FIFO there cannot block the open).
  bool Acquire(const std::string& lock_path, bool for_write, std::string* error) {
    const int flags = O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
    fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | flags, 0644);
    if (fd_ < 0 && errno != ELOOP && !for_write) fd_ = open(lock_path.c_str(), O_RDONLY | flags);
    if (fd_ < 0) {
      *error = errno == ELOOP ? "lock file " + lock_path + " is a symbolic link; not followed"
                              : "cannot open lock file " + lock_path + ": " + ErrnoText(errno);
      return !for_write;
    }
    struct stat st;
    if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      *error = "lock file " + lock_path + " is not a regular file";
      close(fd_);
      fd_ = -1;
      return !for_write;
    }
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      *error = "cannot lock " + lock_path + ": " + ErrnoText(errno);
      return !for_write;
    }
    return true;
  }

 private:
  int fd_ = -1;
};

// kUnreadable: something is at the path but could not be read (permission
// denied, not a regular file, over kMaxTuningCacheBytes, an I/O error). It
// was never parsed, so nothing says it is corrupt.
enum class ReadResult { kOk, kMissing, kUnreadable };

ReadResult ReadWholeFile(const std::string& path, std::string* text, std::string* error) {
  absl::StatusOr<std::string> read = ReadRegularFile(path, kMaxTuningCacheBytes);
  if (absl::IsNotFound(read.status())) return ReadResult::kMissing;
  if (!read.ok()) {
    *error = std::string(read.status().message());
    return ReadResult::kUnreadable;
  }
  *text = *std::move(read);
  return ReadResult::kOk;
}

// Temp files are only created under the lock, so any left while we hold it
// belong to a writer that died mid-write.
std::string TempPrefix(const std::string& path) { return "." + BaseName(path) + ".tmp."; }

void RemoveStaleTemps(const std::string& path) {
  const std::string dir = DirName(path), prefix = TempPrefix(path);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* ent = readdir(d)) {
    const std::string name = ent->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0) unlink((dir + "/" + name).c_str());
  }
  closedir(d);
}

// Write-to-temp, fsync, rename, fsync(dir): a reader sees the old file or the
// new one, never a prefix, even if this process is killed at any point.
bool WriteFileAtomically(const std::string& path, const std::string& text, std::string* error) {
  const std::string dir = DirName(path);
  std::random_device rd;
  const std::string tmp = dir + "/" + TempPrefix(path) + std::to_string(getpid()) + "." + std::to_string(rd());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot create " + tmp + ": " + ErrnoText(errno);
    return false;
  }
  auto fail = [&](const std::string& what) {
    *error = what + " " + tmp + ": " + ErrnoText(errno);
    close(fd);
    unlink(tmp.c_str());
    return false;
  };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return fail("cannot fsync");
  if (close(fd) != 0) {
    *error = "cannot close " + tmp + ": " + ErrnoText(errno);
    unlink(tmp.c_str());
    return false;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + tmp + " to " + path + ": " + ErrnoText(errno);
    unlink(tmp.c_str());
    return false;
  }
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);  // makes the rename durable; some file systems refuse, which is harmless
    close(dfd);
  }
  return true;
}

// Moves a corrupt file out of the way; returns the new name or "" (error set).
std::string RenameAside(const std::string& path, std::string* error) {
  std::string aside = path + ".corrupt-" + UtcNow("%Y%m%dT%H%M%SZ");
  struct stat st;
  if (stat(aside.c_str(), &st) == 0) aside += "-" + std::to_string(getpid());
  if (rename(path.c_str(), aside.c_str()) != 0) {
    *error = ErrnoText(errno);
    return "";
  }
  return aside;
}

// ---- parsing -----------------------------------------------------------------------

struct ParsedFile {
  enum Kind { kMissing, kOk, kCorrupt, kForeignSchema } kind = kMissing;
  std::string why;                // kCorrupt / kForeignSchema
  std::vector<TuningEntry> ours;  // entries of sections stamped like us
  bool has_ours = false;
  std::vector<json> others;  // other sections, verbatim
  std::vector<CacheStamp> other_stamps;
};

ParsedFile ParseCacheText(const std::string& text, const CacheStamp& stamp) {
  ParsedFile p;
  auto corrupt = [&](std::string why) {
    p.kind = ParsedFile::kCorrupt;
    p.why = std::move(why);
    p.ours.clear();
    p.others.clear();
    return p;
  };
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return corrupt("not valid JSON");
  if (!doc.is_object()) return corrupt("not a JSON object");
  auto schema = doc.find("schema");
  if (schema == doc.end() || !schema->is_number_integer()) return corrupt("no schema version");
  if (schema->get<int64_t>() != kTuningCacheSchema) {
    p.kind = ParsedFile::kForeignSchema;
    p.why = absl::StrCat("schema ", schema->get<int64_t>(), " (this build reads ", kTuningCacheSchema, ")");
    return p;
  }
  auto sections = doc.find("sections");
  if (sections == doc.end() || !sections->is_array()) return corrupt("no sections");
  for (json& section : *sections) {
    if (!section.is_object()) return corrupt("a section is not an object");
    auto st = section.find("stamp");
    auto entries = section.find("entries");
    CacheStamp s;
    if (st == section.end() || !StampFromJson(*st, &s)) return corrupt("a section has a bad stamp");
    if (entries == section.end() || !entries->is_array()) return corrupt("a section has no entries");
    if (s != stamp) {
      p.other_stamps.push_back(s);
      p.others.push_back(std::move(section));
      continue;
    }
    p.has_ours = true;
    for (const json& je : *entries) {
      TuningEntry e;
      std::string why;
      if (!EntryFromJson(je, &e, &why)) return corrupt(why);
      p.ours.push_back(std::move(e));
    }
  }
  p.kind = ParsedFile::kOk;
  return p;
}

std::string SerializeCache(const CacheStamp& stamp, const std::map<std::string, TuningEntry>& entries,
                           std::vector<json> others) {
  // Keep the most recently updated foreign sections.
  auto updated = [](const json& s) {
    auto it = s.find("updated");
    return it != s.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  std::stable_sort(others.begin(), others.end(), [&](const json& a, const json& b) { return updated(a) > updated(b); });
  if (others.size() > static_cast<size_t>(kMaxForeignSections)) others.resize(kMaxForeignSections);

  // One entry per line: readable, and diffs of the file stay small.
  std::string out = "{\"format\": \"fusedserve-tuning-cache\", \"schema\": " + std::to_string(kTuningCacheSchema) +
                    ",\n \"sections\": [\n  {\"stamp\": " + StampToJson(stamp).dump() + ",\n   \"updated\": \"" +
                    UtcNow("%Y-%m-%dT%H:%M:%SZ") + "\",\n   \"entries\": [";
  bool first = true;
  for (const auto& [id, e] : entries) {
    out += first ? "\n    " : ",\n    ";
    out += EntryToJson(e).dump();
    first = false;
  }
  out += "]}";
  for (const json& s : others) out += ",\n  " + s.dump();
  out += "\n ]}\n";
  return out;
}

}  // namespace

// ---- TuningCache ---------------------------------------------------------------------

std::unique_ptr<TuningCache> TuningCache::Open(std::string path, CacheStamp stamp) {
  std::unique_ptr<TuningCache> cache(new TuningCache(std::move(path), std::move(stamp)));
  absl::MutexLock io(&cache->io_mu_);
  cache->Load();
  return cache;
}

void TuningCache::Reopen(CacheStamp stamp) {
  absl::MutexLock io(&io_mu_);
  {
    absl::MutexLock l(&mu_);
    stamp_ = std::move(stamp);
    entries_.clear();
    Changed();
    dirty_.clear();
    rejected_.clear();
    writable_ = true;
    state_ = "created";
  }
  Load();
}

void TuningCache::Load() {
  CacheStamp stamp;
  {
    absl::MutexLock l(&mu_);
    stamp = stamp_;
    if (path_.empty()) {
      state_ = "disabled";
      writable_ = false;
      return;
    }
  }
  FileLock lock;
  std::string lock_error;
  lock.Acquire(path_ + ".lock", /*for_write=*/false, &lock_error);
  std::string text, read_error;
  const ReadResult rr = ReadWholeFile(path_, &text, &read_error);
  if (rr == ReadResult::kMissing) {
    absl::MutexLock l(&mu_);
    state_ = "created";
    notices_.push_back("tuning cache " + path_ + " does not exist yet; it will be created");
    return;
  }
  if (rr == ReadResult::kUnreadable) {
    absl::MutexLock l(&mu_);
    MarkUnreadable(read_error);
    return;
  }
  ParsedFile parsed = ParseCacheText(text, stamp);

  absl::MutexLock l(&mu_);
  switch (parsed.kind) {
    case ParsedFile::kMissing:
      break;
    case ParsedFile::kCorrupt: {
      state_ = "corrupt";
      CountRejected("corrupt");
      std::string error;
      const std::string aside = RenameAside(path_, &error);
      if (!aside.empty()) {
        notices_.push_back("warning: tuning cache " + path_ + " is corrupt (" + parsed.why + "); moved to " + aside +
                           " and rebuilding");
      } else {
        notices_.push_back("warning: tuning cache " + path_ + " is corrupt (" + parsed.why +
                           ") and could not be moved aside (" + error + "); rebuilding");
      }
      break;
    }
    case ParsedFile::kForeignSchema:
      state_ = "foreign";
      writable_ = false;
      CountRejected("stale");
      notices_.push_back("warning: tuning cache " + path_ + " has " + parsed.why +
                         "; not used and left untouched; tuned configs stay in memory");
      break;
    case ParsedFile::kOk:
      for (TuningEntry& e : parsed.ours) {
        const std::string id = EntryId(e.op, e.dtype, e.key);
        entries_[id] = std::move(e);
      }
      Changed();
      if (parsed.has_ours || parsed.others.empty()) {
        state_ = "loaded";
        notices_.push_back(
            absl::StrCat("tuning cache ", path_, ": loaded ", entries_.size(), " entries for ", stamp.ToString()));
      } else {
        state_ = "foreign";
        CountRejected("stale");
        notices_.push_back("tuning cache " + path_ + " holds configs for " + parsed.other_stamps[0].ToString() +
                           (parsed.other_stamps.size() > 1 ? " (and others)" : "") + ", not for this one (" +
                           stamp.ToString() + "); not used, kept; this device's configs will be added");
      }
      break;
  }
}

void TuningCache::MarkUnreadable(const std::string& error) {
  state_ = "unreadable";
  writable_ = false;
  CountRejected("unreadable");
  notices_.push_back("warning: tuning cache " + path_ + " cannot be read (" + error +
                     "); left untouched and not written; tuned configs stay in memory");
}

void TuningCache::CountRejected(const std::string& reason) {
  for (auto& [r, n] : rejected_) {
    if (r == reason) {
      ++n;
      return;
    }
  }
  rejected_.emplace_back(reason, 1);
}

std::string TuningCache::state() const {
  absl::MutexLock l(&mu_);
  return state_;
}

CacheStamp TuningCache::stamp() const {
  absl::MutexLock l(&mu_);
  return stamp_;
}

std::optional<TuningEntry> TuningCache::Find(const std::string& op, DType dtype,
                                             const std::vector<int64_t>& bucketed) const {
  const std::string id = EntryId(op, dtype, bucketed);
  absl::ReaderMutexLock l(&mu_);  // every launch looks up: lanes read side by side
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

std::string TuningCache::LookupConfig(const std::string& op, DType dtype, const std::vector<int64_t>& key) const {
  // Every launch looks up its config, and a thread's launches mostly repeat
  // the same op and shape: each thread keeps its last answer, for this cache
  // as it was then (its id and version), and checks it first. The version is
  // read before the lookup, so a change during it only costs a recompute.
  struct Memo {
    uint64_t cache = 0, version = 0;
    std::string op;
    DType dtype = DType::kF32;
    std::vector<int64_t> key;
    std::string config;
  };
  static thread_local Memo memo;
  const uint64_t version = version_.load(std::memory_order_acquire);
  if (memo.cache == id_ && memo.version == version && memo.dtype == dtype && memo.op == op && memo.key == key) {
    return memo.config;
  }
  const std::string id = EntryId(op, dtype, BucketKey(op, key));
  std::string config;
  {
    absl::ReaderMutexLock l(&mu_);  // lanes look up side by side
    auto it = entries_.find(id);
    if (it != entries_.end()) config = it->second.config;
  }
  memo.cache = id_;
  memo.version = version;
  memo.op = op;
  memo.dtype = dtype;
  memo.key = key;
  memo.config = config;
  return config;
}

void TuningCache::Put(TuningEntry entry) {
  entry.key = BucketKey(entry.op, entry.key);
  const std::string id = EntryId(entry.op, entry.dtype, entry.key);
  absl::MutexLock l(&mu_);
  entries_[id] = std::move(entry);
  Changed();
  dirty_[id] = ++generation_;
}

void TuningCache::Forget(const std::string& op, DType dtype, const std::vector<int64_t>& bucketed) {
  const std::string id = EntryId(op, dtype, bucketed);
  absl::MutexLock l(&mu_);
  entries_.erase(id);
  Changed();
  dirty_.erase(id);
}

int64_t TuningCache::size() const {
  absl::MutexLock l(&mu_);
  return static_cast<int64_t>(entries_.size());
}

std::vector<TuningEntry> TuningCache::entries() const {
  absl::MutexLock l(&mu_);
  std::map<std::string, TuningEntry> sorted(entries_.begin(), entries_.end());
  std::vector<TuningEntry> out;
  for (auto& [id, e] : sorted) out.push_back(e);
  return out;
}

bool TuningCache::Flush() {
  absl::MutexLock io(&io_mu_);
  CacheStamp stamp;
  std::unordered_map<std::string, TuningEntry> snapshot;
  std::unordered_map<std::string, uint64_t> dirty;
  {
    absl::MutexLock l(&mu_);
    if (path_.empty()) return true;
    if (!writable_) return false;
    if (dirty_.empty()) return true;
    stamp = stamp_;
    snapshot = entries_;
    dirty = dirty_;
  }
  auto unwritable = [&](const std::string& error) {
    absl::MutexLock l(&mu_);
    state_ = "read_only";
    writable_ = false;
    CountRejected("unwritable");
    notices_.push_back("warning: cannot write tuning cache " + path_ + " (" + error +
                       "); tuned configs are kept in memory only");
    return false;
  };

  MakeDirs(DirName(path_));
  FileLock lock;
  std::string error;
  if (!lock.Acquire(path_ + ".lock", /*for_write=*/true, &error)) return unwritable(error);

  std::string text;
  ParsedFile parsed;
  const ReadResult rr = ReadWholeFile(path_, &text, &error);
  if (rr == ReadResult::kUnreadable) {
    // Became unreadable since we loaded (or was replaced by a directory, a
    // FIFO...): not ours to destroy.
    absl::MutexLock l(&mu_);
    MarkUnreadable(error);
    return false;
  }
  if (rr == ReadResult::kOk) parsed = ParseCacheText(text, stamp);
  if (parsed.kind == ParsedFile::kForeignSchema) {
    // Written by another version since we loaded: leave it alone.
    absl::MutexLock l(&mu_);
    state_ = "foreign";
    writable_ = false;
    notices_.push_back("warning: tuning cache " + path_ + " now has " + parsed.why +
                       "; not written; tuned configs stay in memory");
    return false;
  }
  if (parsed.kind == ParsedFile::kCorrupt) {
    const std::string aside = RenameAside(path_, &error);
    absl::MutexLock l(&mu_);
    CountRejected("corrupt");
    notices_.push_back("warning: tuning cache " + path_ + " is corrupt (" + parsed.why + ")" +
                       (aside.empty() ? "" : "; moved to " + aside) + "; rewriting it");
  }

  // Merge: the file's entries (others may have tuned more), then ours where
  // we tuned them since the last flush or the file lacks them.
  std::map<std::string, TuningEntry> merged;
  for (TuningEntry& e : parsed.ours) merged[EntryId(e.op, e.dtype, e.key)] = std::move(e);
  for (auto& [id, e] : snapshot) {
    if (dirty.count(id) != 0 || merged.count(id) == 0) merged[id] = e;
  }

  const std::string out = SerializeCache(stamp, merged, std::move(parsed.others));
  if (static_cast<int64_t>(out.size()) > kMaxTuningCacheBytes) {
    // Written, it could never be read back.
    return unwritable(absl::StrCat("the merged cache would have ", out.size(), " bytes, more than the limit of ",
                                   kMaxTuningCacheBytes));
  }
  RemoveStaleTemps(path_);
  if (!WriteFileAtomically(path_, out, &error)) return unwritable(error);

  absl::MutexLock l(&mu_);
  for (auto& [id, e] : merged) {
    if (dirty_.count(id) == 0) entries_[id] = std::move(e);
  }
  Changed();
  for (const auto& [id, gen] : dirty) {
    auto it = dirty_.find(id);
    if (it != dirty_.end() && it->second == gen) dirty_.erase(it);
  }
  return true;
}

void TuningCache::Refresh() {
  absl::MutexLock io(&io_mu_);
  CacheStamp stamp;
  {
    absl::MutexLock l(&mu_);
    if (path_.empty() || (state_ == "foreign" && !writable_)) return;
    stamp = stamp_;
  }
  FileLock lock;
  std::string error, text;
  lock.Acquire(path_ + ".lock", /*for_write=*/false, &error);
  if (ReadWholeFile(path_, &text, &error) != ReadResult::kOk) return;
  ParsedFile parsed = ParseCacheText(text, stamp);
  if (parsed.kind != ParsedFile::kOk) return;
  absl::MutexLock l(&mu_);
  for (TuningEntry& e : parsed.ours) {
    const std::string id = EntryId(e.op, e.dtype, e.key);
    if (dirty_.count(id) == 0) entries_[id] = std::move(e);
  }
  Changed();
}

std::vector<std::string> TuningCache::TakeNotices() {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  out.swap(notices_);
  return out;
}

std::vector<std::pair<std::string, int64_t>> TuningCache::rejected() const {
  absl::MutexLock l(&mu_);
  return rejected_;
}

}  // namespace fusedserve
