// Tuning cache and warm-up service on the CPU: file round trip, atomic
// replacement under SIGKILL, concurrent writers (threads and processes)
// merging without loss, foreign stamps and schemas left untouched, corrupt
// files set aside and rebuilt, unreadable ones (permission denied, a
// directory, a FIFO, too large) left alone, a symlinked lock file not
// followed, unwritable directories, and a warm restart
// that times nothing. A fake Tuner stands in for the GPU so the whole
// Warmup() path runs.
#include "warmup/tuning_cache.h"

#include <dirent.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/config.h"
#include "model/kernel_shapes.h"
#include "nlohmann/json.hpp"
#include "tests/unit/run_in_child.h"
#include "warmup/autotuner.h"
#include "warmup/envelope.h"
#include "warmup/warmup.h"

namespace fusedserve {
namespace {

std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/tuning_cache_test.XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    closedir(d);
  }
  return names;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

CacheStamp Stamp(const std::string& device = "Test GPU", const std::string& hash = "h1") {
  CacheStamp s;
  s.device = device;
  s.compute_capability = "9.0";
  s.driver = 13000;
  s.cuda_runtime = 13000;
  s.cublaslt = 130000;
  s.kernel_hash = hash;
  return s;
}

TuningEntry Entry(const std::string& op, std::vector<int64_t> key, const std::string& config, double us = 10) {
  TuningEntry e;
  e.op = op;
  e.dtype = DType::kBF16;
  e.key = std::move(key);
  e.config = config;
  e.time_us = us;
  e.runner_up = "other";
  e.runner_up_us = us + 1;
  e.default_us = us + 2;
  e.candidates = 3;
  return e;
}

// A Tuner without a device: three candidates with fixed times, so the whole
// tune -> cache -> warm-up path runs on the CPU.
class FakeTuner : public Tuner {
 public:
  struct Counters {
    std::atomic<int> tunes{0};
    std::atomic<int> runs{0};
  };
  FakeTuner(CacheStamp stamp, Counters* counters) : stamp_(std::move(stamp)), counters_(counters) {}

  bool Serves(const Backend*) const override { return true; }
  CacheStamp Stamp() const override { return stamp_; }
  absl::StatusOr<TuneResult> Tune(const EnvelopeEntry& e, const ConfigLookup&) override {
    ++counters_->tunes;
    TuneResult r;
    r.default_config = "c0";
    r.candidates = 4;
    r.benchmarks = 3;
    r.default_us = 10;
    r.accepted = {{"c1", 8}, {"c2", 9}, {"c0", 10}};
    r.rejected = {{"c3", "mismatch"}};
    return r;
  }
  absl::Status RunOnce(const EnvelopeEntry& e, const std::string& config, const ConfigLookup&) override {
    ++counters_->runs;
    if (config == "broken") return absl::FailedPreconditionError("config does not launch");
    return absl::OkStatus();
  }

 private:
  CacheStamp stamp_;
  Counters* counters_;
};

// Small model dims so the envelope stays small and the CPU smoke runs are quick.
WarmupOptions SmallOptions(const std::string& cache_path) {
  WarmupOptions o;
  o.cache_path = cache_path;
  o.hidden_size = 64;
  o.intermediate_size = 128;
  o.num_q_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 16;
  o.vocab_size = 256;
  o.max_tokens = 8;
  return o;
}

std::unique_ptr<TuningService> MakeService(const WarmupOptions& o, FakeTuner::Counters* counters,
                                           const CacheStamp& stamp = Stamp(), double flush_interval = 10) {
  TuningServiceInternals internals;
  internals.flush_interval_seconds = flush_interval;
  absl::StatusOr<std::unique_ptr<TuningService>> s =
      CreateTuningService(o, stamp, std::make_unique<FakeTuner>(stamp, counters), internals);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(*s);
}

int64_t Rejected(const WarmupReport& r, const std::string& reason) {
  for (const auto& [name, n] : r.rejected) {
    if (name == reason) return n;
  }
  return 0;
}

int64_t Rejected(const TuningCache& c, const std::string& reason) {
  for (const auto& [name, n] : c.rejected()) {
    if (name == reason) return n;
  }
  return 0;
}

// ---- keys ----------------------------------------------------------------------------

TEST(TuningKeys, TokenDimRoundsUpToPowerOfTwo) {
  EXPECT_EQ(RoundUpPow2(0), 1);
  EXPECT_EQ(RoundUpPow2(1), 1);
  EXPECT_EQ(RoundUpPow2(2), 2);
  EXPECT_EQ(RoundUpPow2(3), 4);
  EXPECT_EQ(RoundUpPow2(513), 1024);
  EXPECT_EQ(RoundUpPow2(16384), 16384);
  EXPECT_EQ(RoundUpPow2(16385), 32768);
  EXPECT_EQ(BucketKey("rms_norm", {3, 4095}), (std::vector<int64_t>{4, 4095}));  // other dims exact
  EXPECT_EQ(BucketKey("linear", {100, 6144, 4096}), (std::vector<int64_t>{128, 6144, 4096}));
  // Decode also buckets the context length.
  EXPECT_EQ(BucketKey("attention_decode", {3, 1000, 32, 8, 128}), (std::vector<int64_t>{4, 1024, 32, 8, 128}));
}

TEST(Envelope, DefaultCoversEveryOpAndBucket) {
  WarmupOptions o;  // 4096 / 14336 / 32 / 8 / 128 / 128256, 16384 tokens
  const std::vector<EnvelopeEntry> env = DefaultEnvelope(o);
  std::set<std::string> ops;
  int rms_buckets = 0;
  for (const EnvelopeEntry& e : env) {
    ops.insert(e.op);
    EXPECT_TRUE(ValidateTuningKey(e.op, e.key).ok()) << e.op;
    EXPECT_EQ(BucketKey(e.op, e.key), e.key);
    if (e.op == "rms_norm") ++rms_buckets;
  }
  EXPECT_EQ(ops.size(), AllOpSpecs().size());
  EXPECT_EQ(rms_buckets, 15);  // 1 ... 16384
}

TEST(Envelope, FileIsParsedBucketedAndDeduplicated) {
  absl::StatusOr<std::vector<EnvelopeEntry>> env = ParseEnvelope(R"([
      {"op": "rms_norm", "dtype": "bf16", "key": [3, 4096]},
      {"op": "rms_norm", "dtype": "bf16", "key": [4, 4096]},
      {"op": "linear", "dtype": "f16", "key": [1, 6144, 4096]}])");
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_EQ(env->size(), 2u);
  EXPECT_EQ((*env)[0].key, (std::vector<int64_t>{4, 4096}));
  EXPECT_EQ((*env)[1].dtype, DType::kF16);
  EXPECT_FALSE(ParseEnvelope(R"([{"op": "nope", "dtype": "bf16", "key": [1, 2]}])").ok());
  EXPECT_FALSE(ParseEnvelope(R"([{"op": "rms_norm", "dtype": "i32", "key": [1, 2]}])").ok());
  EXPECT_FALSE(ParseEnvelope(R"([{"op": "rms_norm", "dtype": "bf16", "key": [1]}])").ok());
  EXPECT_FALSE(ParseEnvelope("{").ok());

  // A bad --envelope file fails Create (operator error), unlike cache problems.
  const std::string dir = MakeTempDir();
  WriteFile(dir + "/env.json", R"([{"op": "rope", "dtype": "bf16", "key": [1, 3, 2, 64]}])");
  WarmupOptions o = SmallOptions(dir + "/cache.json");
  o.envelope_path = dir + "/env.json";
  EXPECT_FALSE(TuningService::Create(o).ok());  // Hq not a multiple of Hkv
  o.envelope_path = dir + "/missing.json";
  EXPECT_FALSE(TuningService::Create(o).ok());
}

// ---- the cache file ----------------------------------------------------------------------

TEST(TuningCache, RoundTripAndLookup) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/sub/dir/cache.json";  // parent directories are created
  {
    std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
    EXPECT_EQ(c->state(), "created");
    c->Put(Entry("rms_norm", {3, 4096}, "t256.r1.v8", 26.13));  // bucketed on Put
    c->Put(Entry("linear", {1, 6144, 4096}, "p0.a2", 30));
    EXPECT_TRUE(c->Flush());
    EXPECT_EQ(c->state(), "created");
  }
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  EXPECT_EQ(c->state(), "loaded");
  EXPECT_EQ(c->size(), 2);
  std::optional<TuningEntry> e = c->Find("rms_norm", DType::kBF16, {4, 4096});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->config, "t256.r1.v8");
  EXPECT_DOUBLE_EQ(e->time_us, 26.13);
  EXPECT_EQ(e->runner_up, "other");
  EXPECT_EQ(e->candidates, 3);
  // Lookups bucket the token dim: any M in (2, 4] hits, the rest miss.
  EXPECT_EQ(c->LookupConfig("rms_norm", DType::kBF16, {3, 4096}), "t256.r1.v8");
  EXPECT_EQ(c->LookupConfig("rms_norm", DType::kBF16, {4, 4096}), "t256.r1.v8");
  EXPECT_EQ(c->LookupConfig("rms_norm", DType::kBF16, {5, 4096}), "");
  EXPECT_EQ(c->LookupConfig("rms_norm", DType::kBF16, {3, 4097}), "");
  EXPECT_EQ(c->LookupConfig("rms_norm", DType::kF16, {3, 4096}), "");
  EXPECT_EQ(c->LookupConfig("linear", DType::kBF16, {1, 6144, 4096}), "p0.a2");

  // The file is versioned, stamped JSON; no temp files are left behind.
  nlohmann::json doc = nlohmann::json::parse(ReadFile(path));
  EXPECT_EQ(doc["schema"], kTuningCacheSchema);
  EXPECT_EQ(doc["sections"][0]["stamp"]["device"], "Test GPU");
  EXPECT_EQ(doc["sections"][0]["entries"].size(), 2u);
  for (const std::string& name : ListDir(dir + "/sub/dir")) {
    EXPECT_TRUE(name == "cache.json" || name == "cache.json.lock") << name;
  }
}

// A thread's repeated lookups are answered from its memo of the last one;
// every change of the cache (Put, Forget, Reopen) and another cache object at
// the same key invalidate it.
TEST(TuningCache, RepeatedLookupsSeeEveryChange) {
  std::unique_ptr<TuningCache> c = TuningCache::Open("", Stamp());
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {4, 128}), "");
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {4, 128}), "");
  c->Put(Entry("gelu", {4, 128}, "v8"));
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {4, 128}), "v8");
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "v8");  // same bucket, another key
  EXPECT_EQ(c->LookupConfig("gelu", DType::kF16, {3, 128}), "");
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "v8");
  c->Put(Entry("gelu", {4, 128}, "v4"));
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "v4");
  c->Forget("gelu", DType::kBF16, {4, 128});
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "");
  c->Put(Entry("gelu", {4, 128}, "v2"));
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "v2");
  c->Reopen(Stamp());
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "");
  // Another cache, same question: its own answer, not this one's memo.
  c->Put(Entry("gelu", {4, 128}, "v8"));
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "v8");
  std::unique_ptr<TuningCache> other = TuningCache::Open("", Stamp());
  EXPECT_EQ(other->LookupConfig("gelu", DType::kBF16, {3, 128}), "");
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {3, 128}), "v8");
}

TEST(TuningCache, FlushWithNothingNewWritesNothing) {
  const std::string dir = MakeTempDir();
  std::unique_ptr<TuningCache> c = TuningCache::Open(dir + "/cache.json", Stamp());
  EXPECT_TRUE(c->Flush());
  EXPECT_FALSE(Exists(dir + "/cache.json"));
}

TEST(TuningCache, DisabledWithoutPath) {
  std::unique_ptr<TuningCache> c = TuningCache::Open("", Stamp());
  EXPECT_EQ(c->state(), "disabled");
  c->Put(Entry("gelu", {1, 128}, "v8"));
  EXPECT_TRUE(c->Flush());
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {1, 128}), "v8");
}

TEST(TuningCache, ForeignStampIsNotUsedAndKept) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  {
    std::unique_ptr<TuningCache> other = TuningCache::Open(path, Stamp("Other GPU"));
    other->Put(Entry("rms_norm", {1, 4096}, "theirs"));
    ASSERT_TRUE(other->Flush());
  }
  const std::string before = ReadFile(path);

  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  EXPECT_EQ(c->state(), "foreign");
  EXPECT_EQ(Rejected(*c, "stale"), 1);
  EXPECT_EQ(c->size(), 0);
  EXPECT_EQ(c->LookupConfig("rms_norm", DType::kBF16, {1, 4096}), "");
  EXPECT_EQ(ReadFile(path), before);  // opening does not touch it

  // Tuning on this device adds its own section next to the other one.
  c->Put(Entry("rms_norm", {1, 4096}, "ours"));
  ASSERT_TRUE(c->Flush());
  std::unique_ptr<TuningCache> theirs = TuningCache::Open(path, Stamp("Other GPU"));
  EXPECT_EQ(theirs->state(), "loaded");
  EXPECT_EQ(theirs->LookupConfig("rms_norm", DType::kBF16, {1, 4096}), "theirs");
  std::unique_ptr<TuningCache> ours = TuningCache::Open(path, Stamp());
  EXPECT_EQ(ours->LookupConfig("rms_norm", DType::kBF16, {1, 4096}), "ours");
  // Any stamp field counts: another kernel build is foreign too.
  EXPECT_EQ(TuningCache::Open(path, Stamp("Test GPU", "h2"))->state(), "foreign");
}

TEST(TuningCache, OtherSchemaIsNeverWritten) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  const std::string future = R"({"schema": 99, "whatever": [1, 2, 3]})";
  WriteFile(path, future);
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  EXPECT_EQ(c->state(), "foreign");
  EXPECT_EQ(Rejected(*c, "stale"), 1);
  c->Put(Entry("softmax", {1, 256}, "x"));
  EXPECT_FALSE(c->Flush());
  EXPECT_EQ(ReadFile(path), future);
  EXPECT_EQ(c->LookupConfig("softmax", DType::kBF16, {1, 256}), "x");  // kept in memory
}

TEST(TuningCache, CorruptFileIsSetAsideAndRebuilt) {
  for (const std::string& garbage :
       {std::string("{\"schema\": 1, \"sections\": [{\"stamp\""),  // truncated
        std::string("\x00\x01garbage", 9), std::string(R"({"schema": 1, "sections": [{"stamp": {"device": 3}}]})"),
        std::string(R"({"schema": 1, "sections": [{"stamp": )") +
            R"({"device": "Test GPU", "compute_capability": "9.0", "driver": 13000, )" +
            R"("cuda_runtime": 13000, "cublaslt": 130000, "kernel_hash": "h1"}, )" +
            R"("entries": [{"op": "rms_norm", "dtype": "bf16", "key": [-1, 2]}]}]})"}) {
    const std::string dir = MakeTempDir();
    const std::string path = dir + "/cache.json";
    WriteFile(path, garbage);
    std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
    EXPECT_EQ(c->state(), "corrupt");
    EXPECT_EQ(Rejected(*c, "corrupt"), 1);
    EXPECT_FALSE(Exists(path));
    std::string aside;
    for (const std::string& name : ListDir(dir)) {
      if (name.rfind("cache.json.corrupt-", 0) == 0) aside = name;
    }
    ASSERT_FALSE(aside.empty());
    EXPECT_EQ(ReadFile(dir + "/" + aside), garbage);  // kept for a post-mortem
    bool warned = false;
    for (const std::string& n : c->TakeNotices()) warned |= n.find(aside) != std::string::npos;
    EXPECT_TRUE(warned);

    c->Put(Entry("rms_norm", {1, 64}, "rebuilt"));
    ASSERT_TRUE(c->Flush());
    std::unique_ptr<TuningCache> again = TuningCache::Open(path, Stamp());
    EXPECT_EQ(again->state(), "loaded");
    EXPECT_EQ(again->LookupConfig("rms_norm", DType::kBF16, {1, 64}), "rebuilt");
  }
}

// A directory nobody may write into: chmod 0555 for an ordinary user; for root
// (which ignores permissions) a path whose parent is a regular file.
std::string UnwritableCachePath(const std::string& dir) {
  if (geteuid() != 0) {
    const std::string ro = dir + "/ro";
    mkdir(ro.c_str(), 0755);
    chmod(ro.c_str(), 0555);
    return ro + "/cache.json";
  }
  WriteFile(dir + "/not_a_dir", "");
  return dir + "/not_a_dir/cache.json";
}

TEST(TuningCache, UnwritableVolumeKeepsConfigsInMemoryWithOneWarning) {
  const std::string dir = MakeTempDir();
  const std::string path = UnwritableCachePath(dir);
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  c->Put(Entry("gelu", {1, 128}, "v8"));
  EXPECT_FALSE(c->Flush());
  EXPECT_EQ(c->state(), "read_only");
  c->Put(Entry("gelu", {2, 128}, "v4"));
  EXPECT_FALSE(c->Flush());
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {1, 128}), "v8");
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {2, 128}), "v4");
  int warnings = 0;
  for (const std::string& n : c->TakeNotices()) warnings += n.rfind("warning:", 0) == 0;
  EXPECT_EQ(warnings, 1);
  EXPECT_EQ(Rejected(*c, "unwritable"), 1);
}

TEST(TuningCache, ServerStartsOnUnwritableVolume) {
  const std::string dir = MakeTempDir();
  FakeTuner::Counters counters;
  std::unique_ptr<TuningService> s = MakeService(SmallOptions(UnwritableCachePath(dir)), &counters);
  std::vector<std::string> lines;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  ASSERT_TRUE(s->Warmup(cpu.get(), [&](const std::string& l) { lines.push_back(l); }).ok());
  const WarmupReport r = s->report();
  EXPECT_EQ(r.cache_state, "read_only");
  EXPECT_EQ(r.entries, static_cast<int64_t>(s->envelope().size()));
  EXPECT_EQ(Rejected(r, "unwritable"), 1);
  int warnings = 0;
  for (const std::string& l : lines) warnings += l.find("cannot write tuning cache") != std::string::npos;
  EXPECT_EQ(warnings, 1);
  EXPECT_EQ(s->lookup()("rms_norm", DType::kBF16, {3, 64}), "c1");
}

// ---- files that cannot be read: left alone, never written -------------------------------

bool HasCorruptAside(const std::string& dir) {
  for (const std::string& name : ListDir(dir)) {
    if (name.find(".corrupt-") != std::string::npos) return true;
  }
  return false;
}

bool NoticeHas(TuningCache& c, const std::string& text) {
  bool found = false;
  for (const std::string& n : c.TakeNotices()) found |= n.find(text) != std::string::npos;
  return found;
}

// A valid cache that this replica may not read (another uid wrote it 0600)
// used to be called corrupt and renamed away for every replica. Root reads
// anything, so as root the reader runs in a child that drops to nobody
// (65534); the directory is writable by it, so the old rename would succeed.
TEST(TuningCache, PermissionDeniedFileIsLeftInPlace) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  {
    std::unique_ptr<TuningCache> writer = TuningCache::Open(path, Stamp());
    writer->Put(Entry("rms_norm", {1, 64}, "t64"));
    ASSERT_TRUE(writer->Flush());
  }
  const std::string before = ReadFile(path);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(path.c_str(), geteuid() == 0 ? 0600 : 0000), 0);
  const int code = testing::RunInChild(
      [&] {
        if (geteuid() == 0 && (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0)) return 10;
        std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
        if (c->state() != "unreadable") return 1;
        if (Rejected(*c, "unreadable") != 1 || Rejected(*c, "corrupt") != 0) return 2;
        if (!NoticeHas(*c, "Permission denied")) return 3;
        c->Put(Entry("gelu", {1, 128}, "v8"));
        if (c->Flush()) return 4;  // memory only: nothing written over the other replica's file
        if (c->LookupConfig("gelu", DType::kBF16, {1, 128}) != "v8") return 5;
        return 0;
      },
      /*timeout_s=*/20);
  chmod(path.c_str(), 0644);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(ReadFile(path), before);
  EXPECT_FALSE(HasCorruptAside(dir));
}

// A directory at the path (a volume mounted one level too deep) is not
// renamed away with its contents.
TEST(TuningCache, DirectoryAtPathIsLeftInPlace) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  WriteFile(path + "/keep", "data");
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  EXPECT_EQ(c->state(), "unreadable");
  EXPECT_EQ(Rejected(*c, "unreadable"), 1);
  EXPECT_EQ(Rejected(*c, "corrupt"), 0);
  EXPECT_TRUE(NoticeHas(*c, "directory"));
  c->Put(Entry("gelu", {1, 128}, "v8"));
  EXPECT_FALSE(c->Flush());
  EXPECT_EQ(c->LookupConfig("gelu", DType::kBF16, {1, 128}), "v8");
  EXPECT_EQ(ReadFile(path + "/keep"), "data");
  EXPECT_FALSE(HasCorruptAside(dir));
}

// A FIFO at the path used to block start-up in open() forever. The body runs
// in a child so that a regression fails the test instead of hanging it.
TEST(TuningCache, FifoAtPathDoesNotBlock) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  const int code = testing::RunInChild(
      [&] {
        std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
        if (c->state() != "unreadable") return 1;
        if (Rejected(*c, "unreadable") != 1) return 2;
        c->Put(Entry("gelu", {1, 128}, "v8"));
        if (c->Flush()) return 3;
        c->Refresh();
        return 0;
      },
      /*timeout_s=*/10);
  EXPECT_EQ(code, 0) << "-1: blocked on the FIFO";
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(HasCorruptAside(dir));
}

// A file over kMaxTuningCacheBytes is not read (it would cost ~10x its size in
// memory) and not renamed: it was never parsed, so nothing says it is corrupt.
TEST(TuningCache, OversizedFileIsRefusedAndLeftInPlace) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  WriteFile(path, "");
  ASSERT_EQ(truncate(path.c_str(), kMaxTuningCacheBytes + 1), 0);  // sparse: no disk used
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  EXPECT_EQ(c->state(), "unreadable");
  EXPECT_EQ(Rejected(*c, "unreadable"), 1);
  EXPECT_TRUE(NoticeHas(*c, std::to_string(kMaxTuningCacheBytes)));
  c->Put(Entry("gelu", {1, 128}, "v8"));
  EXPECT_FALSE(c->Flush());
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, kMaxTuningCacheBytes + 1);
  EXPECT_FALSE(HasCorruptAside(dir));
}

// "<path>.lock" is opened with O_NOFOLLOW: a symbolic link planted there must
// not make the cache create (or lock) its target. Without a safe lock the
// cache is not written, as on a read-only volume.
TEST(TuningCache, SymlinkedLockIsNotFollowed) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  const std::string target = dir + "/elsewhere";
  ASSERT_EQ(symlink(target.c_str(), (path + ".lock").c_str()), 0);
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  EXPECT_EQ(c->state(), "created");
  c->Put(Entry("gelu", {1, 128}, "v8"));
  EXPECT_FALSE(c->Flush());
  EXPECT_EQ(c->state(), "read_only");
  EXPECT_TRUE(NoticeHas(*c, "symbolic link"));
  EXPECT_FALSE(Exists(target));
  EXPECT_FALSE(Exists(path));
  struct stat st;
  ASSERT_EQ(lstat((path + ".lock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

// The warm-up report (and so GetServerInfo and the rejected metric) says
// "unreadable", not "corrupt", and the service still warms up.
TEST(TuningService, UnreadableCacheIsReportedTruthfully) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  FakeTuner::Counters counters;
  std::unique_ptr<TuningService> s = MakeService(SmallOptions(path), &counters);
  std::vector<std::string> lines;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  ASSERT_TRUE(s->Warmup(cpu.get(), [&](const std::string& l) { lines.push_back(l); }).ok());
  const WarmupReport r = s->report();
  EXPECT_EQ(r.cache_state, "unreadable");
  EXPECT_EQ(Rejected(r, "unreadable"), 1);
  EXPECT_EQ(Rejected(r, "corrupt"), 0);
  EXPECT_EQ(Rejected(r, "unwritable"), 0);
  int warnings = 0;
  for (const std::string& l : lines) warnings += l.find("cannot be read") != std::string::npos;
  EXPECT_EQ(warnings, 1);
  EXPECT_EQ(s->lookup()("rms_norm", DType::kBF16, {3, 64}), "c1");
  EXPECT_TRUE(Exists(path));
}

// ---- concurrency --------------------------------------------------------------------------

TEST(TuningCache, ConcurrentWritersInThreadsLoseNothing) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  constexpr int kPerWriter = 40;
  auto writer = [&](const std::string& op) {
    std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
    for (int i = 1; i <= kPerWriter; ++i) {
      c->Put(Entry(op, {1, i}, op + std::to_string(i)));
      EXPECT_TRUE(c->Flush());
    }
  };
  std::thread a(writer, "rms_norm"), b(writer, "softmax");
  a.join();
  b.join();
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  EXPECT_EQ(c->size(), 2 * kPerWriter);
  EXPECT_EQ(c->LookupConfig("softmax", DType::kBF16, {1, 7}), "softmax7");
}

// Two processes tuning disjoint envelopes into one file at once, flushing
// after every entry: the file ends up with both envelopes.
TEST(TuningCache, TwoProcessesTuningAtOnceLoseNoEntries) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  WriteFile(dir + "/a.json", R"([
      {"op": "rms_norm", "dtype": "bf16", "key": [1, 64]}, {"op": "rms_norm", "dtype": "bf16", "key": [2, 64]},
      {"op": "rms_norm", "dtype": "bf16", "key": [4, 64]}, {"op": "rms_norm", "dtype": "bf16", "key": [8, 64]},
      {"op": "gelu", "dtype": "bf16", "key": [1, 64]}, {"op": "gelu", "dtype": "bf16", "key": [2, 64]},
      {"op": "gelu", "dtype": "bf16", "key": [4, 64]}, {"op": "gelu", "dtype": "bf16", "key": [8, 64]}])");
  WriteFile(dir + "/b.json", R"([
      {"op": "softmax", "dtype": "bf16", "key": [1, 64]}, {"op": "softmax", "dtype": "bf16", "key": [2, 64]},
      {"op": "softmax", "dtype": "bf16", "key": [4, 64]}, {"op": "softmax", "dtype": "bf16", "key": [8, 64]},
      {"op": "layer_norm", "dtype": "bf16", "key": [1, 64]}, {"op": "layer_norm", "dtype": "bf16", "key": [2, 64]},
      {"op": "layer_norm", "dtype": "bf16", "key": [4, 64]}, {"op": "layer_norm", "dtype": "bf16", "key": [8, 64]}])");
  for (int round = 0; round < 5; ++round) {
    std::vector<pid_t> children;
    for (const char* env : {"/a.json", "/b.json"}) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        WarmupOptions o = SmallOptions(path);
        o.envelope_path = dir + env;
        FakeTuner::Counters counters;
        std::unique_ptr<TuningService> s = MakeService(o, &counters, Stamp(), /*flush_interval=*/0);
        const bool ok = s->Warmup(nullptr, nullptr).ok() && s->report().cache_state != "read_only";
        _exit(ok ? 0 : 1);
      }
      children.push_back(pid);
    }
    for (pid_t pid : children) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
    EXPECT_EQ(c->state(), "loaded");
    EXPECT_EQ(c->size(), 16) << "round " << round;
    unlink(path.c_str());
  }
}

// SIGKILL a writer at random points of a large write: the file is always a
// complete old or new version, and the dead writer's temp file is removed by
// the next writer.
TEST(TuningCache, AtomicWriteSurvivesKilledWriter) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/cache.json";
  std::srand(12345);
  for (int round = 0; round < 12; ++round) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
      for (int gen = 0;; ++gen) {
        for (int i = 1; i <= 4000; ++i) c->Put(Entry("rms_norm", {1, i}, "gen" + std::to_string(gen)));
        c->Flush();
      }
    }
    usleep(20000 + (std::rand() % 150) * 1000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);

    std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
    const std::string state = c->state();
    EXPECT_TRUE(state == "loaded" || state == "created") << state << " in round " << round;
    if (state == "loaded") {
      EXPECT_EQ(c->size(), 4000);
      // One generation throughout: never a mix of two writes.
      const std::string gen = c->LookupConfig("rms_norm", DType::kBF16, {1, 1});
      EXPECT_EQ(c->LookupConfig("rms_norm", DType::kBF16, {1, 4000}), gen);
    }
  }
  // The next successful writer clears any temp file a killed writer left.
  std::unique_ptr<TuningCache> c = TuningCache::Open(path, Stamp());
  c->Put(Entry("gelu", {1, 64}, "after"));
  ASSERT_TRUE(c->Flush());
  for (const std::string& name : ListDir(dir)) {
    EXPECT_TRUE(name == "cache.json" || name == "cache.json.lock") << name;
  }
}

// ---- the warm-up service ---------------------------------------------------------------------

TEST(TuningService, ColdStartTunesWarmRestartBenchmarksNothing) {
  const std::string dir = MakeTempDir();
  const WarmupOptions o = SmallOptions(dir + "/cache.json");
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::vector<std::string> lines;
  auto log = [&](const std::string& l) { lines.push_back(l); };

  FakeTuner::Counters cold;
  std::unique_ptr<TuningService> s = MakeService(o, &cold);
  const int64_t n = static_cast<int64_t>(s->envelope().size());
  ASSERT_GT(n, 0);
  ASSERT_TRUE(s->Warmup(cpu.get(), log).ok());
  WarmupReport r = s->report();
  EXPECT_EQ(r.cache_state, "created");
  EXPECT_EQ(r.hits, 0);
  EXPECT_EQ(r.misses, n);
  EXPECT_EQ(r.benchmarks, 3 * n);
  EXPECT_EQ(r.entries, n);
  EXPECT_EQ(Rejected(r, "mismatch"), n);
  EXPECT_EQ(cold.tunes.load(), n);
  EXPECT_EQ(cold.runs.load(), n);  // every envelope kernel launched once
  // The best config wins and lookups bucket the token dim.
  EXPECT_EQ(s->lookup()("rms_norm", DType::kBF16, {3, 64}), "c1");
  EXPECT_EQ(s->lookup()("rms_norm", DType::kBF16, {3, 65}), "");
  EXPECT_EQ(s->lookup()("rms_norm", DType::kBF16, {16, 64}), "");  // beyond the envelope: default
  // Progress lines name the entry, the candidates, the winner and the default.
  bool progress = false;
  for (const std::string& l : lines) {
    progress |=
        l.rfind("tuning 1/", 0) == 0 && l.find(
                                            "rms_norm bf16 M=1 H=64: 4 candidates, best c1 8.00 us "
                                            "(default 10.0 us); rejected 1 (c3: mismatch)") != std::string::npos;
  }
  EXPECT_TRUE(progress);
  std::optional<TuningEntry> e = TuningCache::Open(o.cache_path, Stamp())->Find("rms_norm", DType::kBF16, {4, 64});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->runner_up, "c2");
  EXPECT_DOUBLE_EQ(e->default_us, 10);

  FakeTuner::Counters warm;
  std::unique_ptr<TuningService> again = MakeService(o, &warm);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(again->Warmup(cpu.get(), log).ok());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r = again->report();
  EXPECT_EQ(r.cache_state, "loaded");
  EXPECT_EQ(r.hits, n);
  EXPECT_EQ(r.misses, 0);
  EXPECT_EQ(r.benchmarks, 0);
  EXPECT_EQ(warm.tunes.load(), 0);
  EXPECT_EQ(warm.runs.load(), n);
  EXPECT_LT(seconds, 2.0);
}

TEST(TuningService, BudgetAndTuneMissingLimitTuning) {
  const std::string dir = MakeTempDir();
  WarmupOptions o = SmallOptions(dir + "/cache.json");
  o.tune_budget_seconds = 0;
  FakeTuner::Counters counters;
  std::unique_ptr<TuningService> s = MakeService(o, &counters);
  ASSERT_TRUE(s->Warmup(nullptr, nullptr).ok());
  EXPECT_EQ(counters.tunes.load(), 0);
  EXPECT_EQ(s->report().benchmarks, 0);
  EXPECT_EQ(s->report().misses, static_cast<int64_t>(s->envelope().size()));
  EXPECT_FALSE(Exists(o.cache_path));

  o.tune_budget_seconds = 600;
  o.tune_missing = false;
  std::unique_ptr<TuningService> t = MakeService(o, &counters);
  ASSERT_TRUE(t->Warmup(nullptr, nullptr).ok());
  EXPECT_EQ(counters.tunes.load(), 0);
  EXPECT_EQ(t->lookup()("rms_norm", DType::kBF16, {1, 64}), "");
}

TEST(TuningService, CachedConfigThatNoLongerRunsFallsBackToDefault) {
  const std::string dir = MakeTempDir();
  WarmupOptions o = SmallOptions(dir + "/cache.json");
  WriteFile(dir + "/env.json", R"([{"op": "rms_norm", "dtype": "bf16", "key": [1, 64]}])");
  o.envelope_path = dir + "/env.json";
  {
    std::unique_ptr<TuningCache> c = TuningCache::Open(o.cache_path, Stamp());
    c->Put(Entry("rms_norm", {1, 64}, "broken"));
    ASSERT_TRUE(c->Flush());
  }
  FakeTuner::Counters counters;
  std::unique_ptr<TuningService> s = MakeService(o, &counters);
  ASSERT_TRUE(s->Warmup(nullptr, nullptr).ok());
  EXPECT_EQ(s->report().hits, 1);
  EXPECT_EQ(Rejected(s->report(), "launch_failed"), 1);
  EXPECT_EQ(s->lookup()("rms_norm", DType::kBF16, {1, 64}), "");  // default from now on
}

TEST(TuningService, StaleCacheIsRetunedAndKept) {
  const std::string dir = MakeTempDir();
  const WarmupOptions o = SmallOptions(dir + "/cache.json");
  FakeTuner::Counters counters;
  ASSERT_TRUE(MakeService(o, &counters, Stamp("Old GPU"))->Warmup(nullptr, nullptr).ok());
  std::unique_ptr<TuningService> s = MakeService(o, &counters, Stamp("New GPU"));
  EXPECT_EQ(s->report().cache_state, "foreign");
  ASSERT_TRUE(s->Warmup(nullptr, nullptr).ok());
  EXPECT_EQ(s->report().hits, 0);
  EXPECT_EQ(Rejected(s->report(), "stale"), 1);
  EXPECT_EQ(TuningCache::Open(o.cache_path, Stamp("Old GPU"))->state(), "loaded");
  EXPECT_EQ(TuningCache::Open(o.cache_path, Stamp("New GPU"))->state(), "loaded");
}

// The production factory on a machine without a GPU: no tuning, every
// envelope op runs once on the CPU backend at a small shape, well within 2 s
// even for the full-size default envelope.
TEST(TuningService, CpuWarmupOfDefaultEnvelopeIsQuick) {
  const std::string dir = MakeTempDir();
  WarmupOptions o;
  o.cache_path = dir + "/cache.json";
  absl::StatusOr<std::unique_ptr<TuningService>> s = TuningService::Create(o);
  ASSERT_TRUE(s.ok()) << s.status();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::vector<std::string> lines;
  ASSERT_TRUE((*s)->Warmup(cpu.get(), [&](const std::string& l) { lines.push_back(l); }).ok());
  const WarmupReport r = (*s)->report();
  EXPECT_EQ(r.benchmarks, 0);
  EXPECT_LT(r.seconds, 2.0);
  EXPECT_FALSE(lines.empty());
  EXPECT_FALSE(Exists(o.cache_path));  // nothing tuned, nothing written
}

// The default envelope covers the standard shapes and the hosted model's,
// each entry once.
TEST(Envelope, DefaultAddsTheModelShapesOnce) {
  WarmupOptions o;
  o.max_tokens = 4;  // buckets 1, 2, 4
  const size_t standard = DefaultEnvelope(o).size();
  o.model_shapes.push_back({o.hidden_size, o.intermediate_size, o.num_q_heads, o.num_kv_heads, o.head_dim,
                            o.vocab_size});  // same as the standard: nothing new
  EXPECT_EQ(DefaultEnvelope(o).size(), standard);
  o.model_shapes = {{64, 176, 4, 2, 16, 512}};  // a tiny model: head dim 16, no attention kernels
  const std::vector<EnvelopeEntry> env = DefaultEnvelope(o);
  EXPECT_GT(env.size(), standard);
  std::set<std::pair<std::string, std::vector<int64_t>>> keys;
  for (const EnvelopeEntry& e : env) keys.insert({e.op, e.key});
  EXPECT_EQ(keys.size(), env.size());
  EXPECT_TRUE(keys.count({"rms_norm", {4, 64}}));
  EXPECT_TRUE(keys.count({"rms_norm", {4, 4096}}));
  EXPECT_TRUE(keys.count({"linear", {2, 4 * 16 + 2 * 2 * 16, 64}}));
  for (const EnvelopeEntry& e : env) {
    if (e.op == "attention" || e.op == "attention_decode") {
      EXPECT_NE(e.key.back(), 16) << e.op;
    }
  }
}

// With a hosted model the envelope is the model's own: every key its CUDA
// runner looks up (kernel_shapes.h, any row count, bucketed as the cache
// buckets it), in the model's dtype, linear before swiglu_mlp, and the
// FusedOp entries at its dims only (none at the standard 8B dims, none bf16
// for an fp32 checkpoint).
TEST(Envelope, HostedModelEnvelopeIsTheModelsOwnInItsDtype) {
  ModelConfig c = *PresetConfig("llama-3.2-1b");
  c.dtype = DType::kF32;  // an fp32 checkpoint
  const int64_t max_tokens = 512, max_seqs = 16;
  WarmupOptions o;
  o.max_tokens = max_tokens;
  o.dtype = c.dtype;
  o.model_entries = ModelEnvelope(c, max_tokens, max_seqs);
  o.model_shapes = {{c.hidden, c.intermediate, c.q_heads, c.kv_heads, c.head_dim, c.vocab}};
  const std::vector<EnvelopeEntry> env = DefaultEnvelope(o);
  std::set<std::string> ids;
  size_t last_linear = 0, first_swiglu = env.size();
  for (size_t i = 0; i < env.size(); ++i) {
    const EnvelopeEntry& e = env[i];
    EXPECT_EQ(e.dtype, DType::kF32) << e.op;
    EXPECT_TRUE(ValidateTuningKey(e.op, e.key).ok()) << e.op;
    if (e.op != "attention_decode") {
      EXPECT_NE(e.key[1], 4096) << e.op << ": a standard-dims entry";
    }
    ids.insert(EntryId(e.op, e.dtype, e.key));
    if (e.op == "linear") last_linear = i;
    if (e.op == "swiglu_mlp") first_swiglu = std::min(first_swiglu, i);
  }
  EXPECT_EQ(ids.size(), env.size());
  EXPECT_LT(last_linear, first_swiglu);
  int looked_up = 0;
  for (int k = 0; k < kModelKernels; ++k) {
    const ModelKernel kernel = static_cast<ModelKernel>(k);
    const int64_t rows = kernel == ModelKernel::kLmHead ? max_seqs : max_tokens;
    for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{9}, int64_t{16}, int64_t{300}, int64_t{512}}) {
      if (m > rows) continue;
      const ModelKernelKey key = KeyOfModelKernel(c, kernel, m);
      EXPECT_TRUE(ids.count(EntryId(key.op, c.dtype, BucketKey(key.op, key.key))))
          << key.op << " " << FormatTuningKey(key.op, key.key);
      ++looked_up;
    }
  }
  EXPECT_GT(looked_up, 40);
  // The LM head is tuned for the batch sizes only.
  const ModelKernelKey lm = KeyOfModelKernel(c, ModelKernel::kLmHead, 64);
  EXPECT_FALSE(ids.count(EntryId(lm.op, c.dtype, lm.key)));
}

}  // namespace
}  // namespace fusedserve
