// The dynamic batcher: merging and splitting are exact (every caller gets
// what it would get alone, bit for bit, on the CPU reference), incompatible
// requests stay apart, and the scheduler honours deadlines, cancellation,
// queue limits and order.
#include "server/batcher.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/validation.h"

namespace fusedserve {
namespace {

// Row counts of a few requests of one op; they must merge.
struct MergeCase {
  std::string op;
  std::vector<std::vector<int64_t>> keys;  // TuningKey order; only the first dim differs
};

std::vector<MergeCase> MergeCases() {
  return {
      {"rms_norm", {{1, 40}, {3, 40}, {2, 40}}},
      {"add_rms_norm", {{2, 24}, {1, 24}, {5, 24}}},
      {"add_rms_norm_silu", {{1, 24}, {4, 24}}},
      {"layer_norm", {{3, 17}, {1, 17}, {2, 17}}},
      {"softmax", {{1, 33}, {2, 33}, {1, 33}}},
      {"silu_and_mul", {{2, 12}, {3, 12}}},
      {"gelu", {{1, 10}, {4, 10}}},
      {"rope", {{3, 4, 2, 16}, {1, 4, 2, 16}, {5, 4, 2, 16}}},
      {"linear", {{2, 9, 24}, {1, 9, 24}, {3, 9, 24}}},
      {"swiglu_mlp", {{1, 16, 20}, {3, 16, 20}}},
      {"attention", {{5, 4, 2, 16}, {3, 4, 2, 16}, {7, 4, 2, 16}}},
      {"attention_decode", {{2, 9, 4, 2, 16}, {1, 9, 4, 2, 16}, {3, 9, 4, 2, 16}}},
  };
}

// Requests that differ in their row inputs but share weights (copied from
// the first one) so that they merge.
std::vector<OpRequest> MakeParts(const MergeCase& c, DType dt, uint64_t seed) {
  std::vector<OpRequest> parts;
  for (const auto& key : c.keys) parts.push_back(MakeRandomRequest(c.op, dt, key, seed++));
  const OpRequest& first = parts.front();
  for (OpRequest& p : parts) {
    for (const char* w : {"weight", "bias", "gate_up", "down"}) {
      if (first.has(w)) p.inputs[w] = first.in(w);
    }
  }
  return parts;
}

TEST(BatchMerge, EveryOpMergedEqualsAlone) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  for (const MergeCase& c : MergeCases()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(c.op + " " + DTypeName(dt));
      std::vector<OpRequest> parts = MakeParts(c, dt, 11);
      if (c.op == "attention") {
        // Two sequences in the middle part: seq_lens are concatenated.
        parts[1].inputs["seq_lens"] = HostTensor::FromInt64(DType::kI64, {2}, {1, 2});
      }
      std::vector<TensorMap> alone;
      for (const OpRequest& p : parts) {
        absl::StatusOr<TensorMap> r = cpu->Run(p);
        ASSERT_TRUE(r.ok()) << r.status();
        alone.push_back(*r);
      }
      const std::optional<BatchShape> s0 = BatchShapeOf(parts[0]);
      ASSERT_TRUE(s0.has_value());
      for (const OpRequest& p : parts) {
        ASSERT_EQ(BatchShapeOf(p)->key, s0->key);
        ASSERT_TRUE(SameNonRowInputs(parts[0], p));
      }
      std::vector<OutputLayout> layouts;
      std::vector<OpRequest*> ptrs;
      for (OpRequest& p : parts) {
        layouts.push_back(OutputLayoutOf(p));
        ptrs.push_back(&p);
      }
      OpRequest merged = MergeRequests(ptrs);
      ASSERT_TRUE(ValidateOpRequest(merged).ok());
      absl::StatusOr<TensorMap> out = cpu->Run(merged);
      ASSERT_TRUE(out.ok()) << out.status();
      absl::StatusOr<std::vector<TensorMap>> split = SplitOutputs(layouts, *out);
      ASSERT_TRUE(split.ok()) << split.status();
      ASSERT_EQ(split->size(), parts.size());
      for (size_t i = 0; i < parts.size(); ++i) {
        ASSERT_EQ((*split)[i].size(), alone[i].size());
        for (const auto& [name, want] : alone[i]) {
          const HostTensor& got = (*split)[i].at(name);
          EXPECT_EQ(got.shape, want.shape) << name << " part " << i;
          EXPECT_EQ(got.dtype, want.dtype);
          EXPECT_TRUE(got.data == want.data) << name << " part " << i;
        }
      }
      // The weights come back for a fallback run.
      RestoreNonRowInputs(merged, parts[0]);
      EXPECT_TRUE(cpu->Run(parts[0]).ok());
    }
  }
}

// Row-wise ops view inputs as [rows, last]: a [2,3,H] request merges with [M,H].
TEST(BatchMerge, RowWiseOpsFlattenLeadingDims) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  OpRequest a = MakeRandomRequest("rms_norm", DType::kF32, {6, 32}, 1);
  a.inputs["x"].shape = {2, 3, 32};
  OpRequest b = MakeRandomRequest("rms_norm", DType::kF32, {4, 32}, 2);
  b.inputs["weight"] = a.in("weight");
  ASSERT_EQ(BatchShapeOf(a)->key, BatchShapeOf(b)->key);
  EXPECT_EQ(BatchShapeOf(a)->rows, 6);
  const TensorMap want_a = *cpu->Run(a), want_b = *cpu->Run(b);
  std::vector<OutputLayout> layouts = {OutputLayoutOf(a), OutputLayoutOf(b)};
  OpRequest merged = MergeRequests({&a, &b});
  EXPECT_EQ(merged.in("x").shape, (std::vector<int64_t>{10, 32}));
  absl::StatusOr<std::vector<TensorMap>> split = SplitOutputs(layouts, *cpu->Run(merged));
  ASSERT_TRUE(split.ok());
  EXPECT_EQ((*split)[0].at("y").shape, (std::vector<int64_t>{2, 3, 32}));
  EXPECT_TRUE((*split)[0].at("y").data == want_a.at("y").data);
  EXPECT_TRUE((*split)[1].at("y").data == want_b.at("y").data);
}

TEST(BatchMerge, IncompatibleRequestsGetDifferentKeys) {
  const OpRequest base = MakeRandomRequest("rms_norm", DType::kF32, {2, 16}, 1);
  auto key = [](const OpRequest& r) { return BatchShapeOf(r)->key; };
  {
    OpRequest r = base;  // more rows only: same key
    r.inputs["x"] = MakeRandomRequest("rms_norm", DType::kF32, {7, 16}, 9).in("x");
    EXPECT_EQ(key(r), key(base));
  }
  {
    OpRequest r = base;
    r.attrs["eps"] = 1e-6;
    EXPECT_NE(key(r), key(base)) << "attributes";
  }
  {
    OpRequest r = base;
    r.inputs["weight"] = MakeRandomRequest("rms_norm", DType::kF32, {2, 16}, 2).in("weight");
    EXPECT_NE(key(r), key(base)) << "weights";
    EXPECT_FALSE(SameNonRowInputs(r, base));
  }
  EXPECT_NE(key(MakeRandomRequest("rms_norm", DType::kF32, {2, 17}, 1)), key(base)) << "hidden size";
  EXPECT_NE(key(MakeRandomRequest("rms_norm", DType::kBF16, {2, 16}, 1)), key(base)) << "dtype";
  EXPECT_NE(key(MakeRandomRequest("layer_norm", DType::kF32, {2, 16}, 1)), key(base)) << "op";
  // Decode: a different cache length L cannot merge.
  EXPECT_NE(key(MakeRandomRequest("attention_decode", DType::kF32, {1, 8, 4, 2, 16}, 1)),
            key(MakeRandomRequest("attention_decode", DType::kF32, {1, 9, 4, 2, 16}, 1)));
  // rope: positions of another integer dtype do not merge.
  OpRequest r1 = MakeRandomRequest("rope", DType::kF32, {2, 4, 2, 16}, 1);
  OpRequest r2 = r1;
  r2.inputs["positions"] = HostTensor::FromInt64(DType::kI32, {2}, {0, 1});
  EXPECT_NE(key(r1), key(r2));
}

TEST(BatchFlags, ParseOverrides) {
  BatchPolicy base;
  base.max_rows = 100;
  absl::StatusOr<std::map<std::string, BatchPolicy>> o =
      ParseBatchOverrides("rms_norm:max_rows=8192:delay_us=100,linear:preferred=128/64:idle_us=0:max_queue=7", base);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->at("rms_norm").max_rows, 8192);
  EXPECT_EQ(o->at("rms_norm").max_delay_us, 100);
  EXPECT_EQ(o->at("rms_norm").idle_us, base.idle_us);
  EXPECT_EQ(o->at("linear").max_rows, 100);
  EXPECT_EQ(o->at("linear").preferred_rows, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(o->at("linear").idle_us, 0);
  EXPECT_EQ(o->at("linear").max_queue, 7);
  EXPECT_TRUE(ParseBatchOverrides("", base)->empty());
  EXPECT_FALSE(ParseBatchOverrides("rms_normz:max_rows=1", base).ok());
  EXPECT_FALSE(ParseBatchOverrides("rms_norm:rows=1", base).ok());
  EXPECT_FALSE(ParseBatchOverrides("rms_norm:max_rows=0", base).ok());
  EXPECT_FALSE(ParseBatchOverrides("rms_norm:delay_us=-3", base).ok());
  EXPECT_FALSE(ParseRowList("4,x").ok());
  EXPECT_EQ(*ParseRowList("64, 8,64"), (std::vector<int64_t>{8, 64}));
}

// ---- the scheduler -------------------------------------------------------------

// Runs the CPU reference, but each Run waits while the gate is closed, and
// every launch's row count is recorded.
class GatedBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::string device_name() const override { return "gated CPU reference"; }
  using Backend::Run;
  absl::StatusOr<TensorMap> Run(const OpRequest& r, const StopCheck&, const WhileRunning&) override {
    {
      absl::MutexLock lock(&mu_);
      launches_.push_back(BatchShapeOf(r)->rows);
      mu_.Await(absl::Condition(&open_));
      if (fail_merged_ && launches_.back() > 1) return absl::UnimplementedError("merged launch too big");
    }
    return cpu_->Run(r);
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void FailMerged() {
    absl::MutexLock lock(&mu_);
    fail_merged_ = true;
  }
  // Waits until n launches have started.
  void WaitLaunches(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return launches_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  std::vector<int64_t> launches() {
    absl::MutexLock lock(&mu_);
    return launches_;
  }

 private:
  std::unique_ptr<Backend> cpu_ = MakeCpuBackend();
  absl::Mutex mu_;
  bool open_ = false;
  bool fail_merged_ = false;
  std::vector<int64_t> launches_;
};

// One caller's outcome.
struct Result {
  absl::Notification done;
  absl::StatusOr<TensorMap> value = absl::UnknownError("not called");
  int order = -1;
  bool one_group = false;  // LaunchAnswersShareOneGroup() inside done
  std::thread::id answered_on;
};

class BatcherTest : public ::testing::Test {
 public:  // also used by the helpers below
  std::unique_ptr<OpScheduler> Make(BatcherOptions o) {
    absl::StatusOr<std::unique_ptr<OpScheduler>> s = MakeBatcher(&backend_, &metrics_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  absl::Status Submit(OpScheduler& s, const OpRequest& r, Result* out, absl::Time deadline = absl::InfiniteFuture(),
                      std::function<bool()> cancelled = nullptr, const void* answer_group = nullptr) {
    OpTask t;
    t.request = r;
    t.answer_group = answer_group;
    t.enqueued = absl::Now();
    t.deadline = deadline;
    if (cancelled) {
      t.interrupted = [cancelled] { return cancelled() ? absl::CancelledError("cancelled") : absl::OkStatus(); };
    }
    t.done = [this, out](absl::StatusOr<TensorMap> v) {
      out->one_group = LaunchAnswersShareOneGroup();
      out->answered_on = std::this_thread::get_id();
      out->value = std::move(v);
      out->order = finished_.fetch_add(1);
      out->done.Notify();
    };
    return s.Submit(std::move(t));
  }

  GatedBackend backend_;
  Metrics metrics_;
  std::atomic<int> finished_{0};
};

BatcherOptions SlowOptions() {
  BatcherOptions o;
  o.threads = 1;
  o.defaults.max_delay_us = 1000;
  o.defaults.idle_us = 0;
  return o;
}

// While one launch is in flight, compatible arrivals queue up and go out as
// one merged launch; every caller gets its own rows, equal to running alone.
TEST_F(BatcherTest, QueuedRequestsMergeIntoOneLaunch) {
  std::unique_ptr<OpScheduler> s = Make(SlowOptions());
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const OpRequest first = MakeRandomRequest("rms_norm", DType::kF32, {1, 64}, 100);
  Result r0;
  ASSERT_TRUE(Submit(*s, first, &r0).ok());
  backend_.WaitLaunches(1);  // idle batcher: the lone request went at once
  std::vector<OpRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    OpRequest r = MakeRandomRequest("rms_norm", DType::kF32, {1 + i % 3, 64}, 200 + i);
    r.inputs["weight"] = first.in("weight");
    reqs.push_back(r);
  }
  std::vector<Result> results(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_TRUE(Submit(*s, reqs[i], &results[i]).ok());
  backend_.Open();
  r0.done.WaitForNotification();
  for (Result& r : results) r.done.WaitForNotification();
  EXPECT_EQ(backend_.launches(), (std::vector<int64_t>{1, 1 + 2 + 3 + 1 + 2 + 3}));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].value.ok()) << results[i].value.status();
    EXPECT_TRUE(results[i].value->at("y").data == cpu->Run(reqs[i])->at("y").data) << i;
    EXPECT_EQ(results[i].value->at("y").shape, reqs[i].in("x").shape);
    EXPECT_EQ(results[i].order, static_cast<int>(i) + 1) << "callers answered in arrival order";
  }
}

// A launch whose callers all share one answer group (the async server: one
// completion queue) tells them so while they are answered; a launch mixing
// groups, or with callers that name none, does not.
TEST_F(BatcherTest, LaunchTellsWhetherItsCallersShareOneAnswerGroup) {
  std::unique_ptr<OpScheduler> s = Make(SlowOptions());
  const int a = 0, b = 0;  // two groups: any two distinct addresses
  const OpRequest first = MakeRandomRequest("rms_norm", DType::kF32, {1, 64}, 100);
  auto like_first = [&](uint64_t seed) {
    OpRequest r = MakeRandomRequest("rms_norm", DType::kF32, {1, 64}, seed);
    r.inputs["weight"] = first.in("weight");
    return r;
  };
  auto round = [&](const std::vector<const void*>& groups) {
    std::vector<Result> results(groups.size() + 1);
    backend_.Close();
    // Counted before the submit: the lone request's launch may start before
    // this thread runs again (it hung CI once when counted after).
    const size_t launched = backend_.launches().size();
    EXPECT_TRUE(Submit(*s, first, &results[0], absl::InfiniteFuture(), nullptr, &a).ok());
    backend_.WaitLaunches(launched + 1);  // the lone one holds the backend; the rest queue and merge
    for (size_t i = 0; i < groups.size(); ++i) {
      EXPECT_TRUE(Submit(*s, like_first(200 + i), &results[i + 1], absl::InfiniteFuture(), nullptr, groups[i]).ok());
    }
    backend_.Open();
    std::vector<bool> one;
    for (Result& r : results) {
      r.done.WaitForNotification();
      EXPECT_TRUE(r.value.ok()) << r.value.status();
      one.push_back(r.one_group);
    }
    return one;
  };
  EXPECT_EQ(round({&a, &a, &a}), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(round({&a, &b, &a}), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(round({nullptr, nullptr}), (std::vector<bool>{true, false, false}));
  EXPECT_FALSE(LaunchAnswersShareOneGroup());
}

TEST_F(BatcherTest, DifferentWeightsOrAttrsAreNotMerged) {
  std::unique_ptr<OpScheduler> s = Make(SlowOptions());
  const OpRequest a = MakeRandomRequest("rms_norm", DType::kF32, {2, 32}, 1);
  OpRequest b = MakeRandomRequest("rms_norm", DType::kF32, {3, 32}, 2);  // other weight
  OpRequest c = a;
  c.attrs["eps"] = 1e-3;
  Result ra, rb, rc, ra2;
  ASSERT_TRUE(Submit(*s, a, &ra).ok());
  backend_.WaitLaunches(1);
  ASSERT_TRUE(Submit(*s, b, &rb).ok());
  ASSERT_TRUE(Submit(*s, c, &rc).ok());
  ASSERT_TRUE(Submit(*s, a, &ra2).ok());
  backend_.Open();
  for (Result* r : {&ra, &rb, &rc, &ra2}) r->done.WaitForNotification();
  EXPECT_EQ(backend_.launches(), (std::vector<int64_t>{2, 3, 2, 2}));
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  EXPECT_TRUE(rb.value->at("y").data == cpu->Run(b)->at("y").data);
  EXPECT_TRUE(rc.value->at("y").data == cpu->Run(c)->at("y").data);
  EXPECT_TRUE(ra2.value->at("y").data == cpu->Run(a)->at("y").data);
}

TEST_F(BatcherTest, MaxRowsSplitsTheQueue) {
  BatcherOptions o = SlowOptions();
  o.defaults.max_rows = 4;
  std::unique_ptr<OpScheduler> s = Make(o);
  const OpRequest r = MakeRandomRequest("softmax", DType::kF32, {2, 8}, 1);
  std::vector<Result> results(6);
  ASSERT_TRUE(Submit(*s, r, &results[0]).ok());
  backend_.WaitLaunches(1);
  for (int i = 1; i < 6; ++i) ASSERT_TRUE(Submit(*s, r, &results[i]).ok());
  backend_.Open();
  for (Result& x : results) x.done.WaitForNotification();
  EXPECT_EQ(backend_.launches(), (std::vector<int64_t>{2, 4, 4, 2}));
}

// A merged launch stays within the per-request cost bounds: with a bound
// that two of these requests fit under but three do not, five queued
// requests launch as 2 + 2 + 1 (rows 4, 4, 2) although max_rows allows all.
void ExpectCostBoundCuts(BatcherTest& t, GatedBackend& backend, const BatcherOptions& o, const OpRequest& r) {
  std::unique_ptr<OpScheduler> s = t.Make(o);
  std::vector<Result> results(6);
  ASSERT_TRUE(t.Submit(*s, r, &results[0]).ok());
  backend.WaitLaunches(1);
  for (int i = 1; i < 6; ++i) ASSERT_TRUE(t.Submit(*s, r, &results[i]).ok());
  backend.Open();
  for (Result& x : results) x.done.WaitForNotification();
  EXPECT_EQ(backend.launches(), (std::vector<int64_t>{2, 4, 4, 2}));
}

TEST_F(BatcherTest, FlopsBoundCutsBatches) {
  const OpRequest r = MakeRandomRequest("softmax", DType::kF32, {2, 8}, 1);
  BatcherOptions o = SlowOptions();
  o.max_launch_flops = 2.5 * EstimateCost(r).flops;
  ExpectCostBoundCuts(*this, backend_, o, r);
}

TEST_F(BatcherTest, BytesBoundCutsBatches) {
  const OpRequest r = MakeRandomRequest("softmax", DType::kF32, {2, 8}, 1);
  const OpCost c = EstimateCost(r);
  BatcherOptions o = SlowOptions();
  o.max_launch_bytes = 2.5 * (c.output_bytes + c.scratch_bytes);
  ExpectCostBoundCuts(*this, backend_, o, r);
}

TEST_F(BatcherTest, PreferredSizesCutBatches) {
  BatcherOptions o = SlowOptions();
  o.defaults.preferred_rows = {2, 4};
  std::unique_ptr<OpScheduler> s = Make(o);
  const OpRequest r = MakeRandomRequest("gelu", DType::kF32, {1, 8}, 1);
  std::vector<Result> results(6);
  ASSERT_TRUE(Submit(*s, r, &results[0]).ok());
  backend_.WaitLaunches(1);
  for (int i = 1; i < 6; ++i) ASSERT_TRUE(Submit(*s, r, &results[i]).ok());
  backend_.Open();
  for (Result& x : results) x.done.WaitForNotification();
  EXPECT_EQ(backend_.launches(), (std::vector<int64_t>{1, 4, 1}));
}

// A queue that reaches the largest preferred size launches at once, even
// while the backend is busy and the delay is long.
TEST_F(BatcherTest, FullPreferredBatchDoesNotWait) {
  BatcherOptions o;
  o.threads = 2;
  o.defaults.preferred_rows = {4};
  o.defaults.max_delay_us = 10'000'000;
  std::unique_ptr<OpScheduler> s = Make(o);
  const OpRequest r = MakeRandomRequest("gelu", DType::kF32, {1, 8}, 1);
  std::vector<Result> results(5);
  ASSERT_TRUE(Submit(*s, r, &results[0]).ok());
  backend_.WaitLaunches(1);
  const absl::Time t0 = absl::Now();
  for (int i = 1; i < 5; ++i) ASSERT_TRUE(Submit(*s, r, &results[i]).ok());
  backend_.WaitLaunches(2);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_EQ(backend_.launches(), (std::vector<int64_t>{1, 4}));
  backend_.Open();
  for (Result& x : results) x.done.WaitForNotification();
}

TEST_F(BatcherTest, DeadlinePassedWhileQueuedIsDroppedBeforeLaunch) {
  std::unique_ptr<OpScheduler> s = Make(SlowOptions());
  const OpRequest r = MakeRandomRequest("gelu", DType::kF32, {1, 8}, 1);
  Result busy, late, fine;
  ASSERT_TRUE(Submit(*s, r, &busy).ok());
  backend_.WaitLaunches(1);
  ASSERT_TRUE(Submit(*s, r, &late, absl::Now() + absl::Milliseconds(5)).ok());
  ASSERT_TRUE(Submit(*s, r, &fine, absl::Now() + absl::Seconds(60)).ok());
  absl::SleepFor(absl::Milliseconds(30));
  backend_.Open();
  for (Result* x : {&busy, &late, &fine}) x->done.WaitForNotification();
  EXPECT_EQ(late.value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(fine.value.ok());
  EXPECT_EQ(backend_.launches(), (std::vector<int64_t>{1, 1})) << "the late one never reached the backend";
}

TEST_F(BatcherTest, CancelledWhileQueuedIsDroppedBeforeLaunch) {
  std::unique_ptr<OpScheduler> s = Make(SlowOptions());
  const OpRequest r = MakeRandomRequest("gelu", DType::kF32, {1, 8}, 1);
  std::atomic<bool> cancel{false};
  Result busy, gone, fine;
  ASSERT_TRUE(Submit(*s, r, &busy).ok());
  backend_.WaitLaunches(1);
  ASSERT_TRUE(Submit(*s, r, &gone, absl::InfiniteFuture(), [&] { return cancel.load(); }).ok());
  ASSERT_TRUE(Submit(*s, r, &fine).ok());
  cancel = true;
  backend_.Open();
  for (Result* x : {&busy, &gone, &fine}) x->done.WaitForNotification();
  EXPECT_EQ(gone.value.status().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(fine.value.ok());
  EXPECT_EQ(backend_.launches(), (std::vector<int64_t>{1, 1}));
}

TEST_F(BatcherTest, FullQueueIsResourceExhaustedImmediately) {
  BatcherOptions o = SlowOptions();
  o.max_queue = 3;
  o.per_op["softmax"] = o.defaults;
  o.per_op["softmax"].max_queue = 1;
  std::unique_ptr<OpScheduler> s = Make(o);
  const OpRequest r = MakeRandomRequest("gelu", DType::kF32, {1, 8}, 1);
  std::vector<Result> results(4);
  ASSERT_TRUE(Submit(*s, r, &results[0]).ok());
  backend_.WaitLaunches(1);  // running, no longer queued
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(Submit(*s, r, &results[i]).ok());
  Result rejected;
  const absl::Time t0 = absl::Now();
  absl::Status st = Submit(*s, r, &rejected);
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(50));
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_FALSE(rejected.done.HasBeenNotified()) << "done is not called on a rejected Submit";
  backend_.Open();
  for (Result& x : results) x.done.WaitForNotification();
  for (Result& x : results) EXPECT_TRUE(x.value.ok());
}

TEST_F(BatcherTest, PerOpQueueLimit) {
  BatcherOptions o = SlowOptions();
  o.per_op["softmax"] = o.defaults;
  o.per_op["softmax"].max_queue = 1;
  std::unique_ptr<OpScheduler> s = Make(o);
  Result busy, one, two, other;
  ASSERT_TRUE(Submit(*s, MakeRandomRequest("gelu", DType::kF32, {1, 8}, 1), &busy).ok());
  backend_.WaitLaunches(1);
  const OpRequest sm = MakeRandomRequest("softmax", DType::kF32, {1, 8}, 1);
  ASSERT_TRUE(Submit(*s, sm, &one).ok());
  EXPECT_EQ(Submit(*s, sm, &two).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Submit(*s, MakeRandomRequest("gelu", DType::kF32, {1, 8}, 2), &other).ok());
  backend_.Open();
  for (Result* x : {&busy, &one, &other}) x->done.WaitForNotification();
}

// An idle batcher never makes a lone request wait for company, however long
// the configured delay.
TEST_F(BatcherTest, LoneRequestIsNotDelayed) {
  backend_.Open();
  BatcherOptions o;
  o.threads = 2;
  o.defaults.max_delay_us = 2'000'000;
  o.defaults.idle_us = 1'000'000;
  std::unique_ptr<OpScheduler> s = Make(o);
  const OpRequest r = MakeRandomRequest("rms_norm", DType::kF32, {1, 64}, 1);
  for (int i = 0; i < 20; ++i) {
    Result x;
    const absl::Time t0 = absl::Now();
    ASSERT_TRUE(Submit(*s, r, &x).ok());
    x.done.WaitForNotification();
    EXPECT_LT(absl::Now() - t0, absl::Milliseconds(100));
    EXPECT_TRUE(x.value.ok());
  }
}

// With a launch in flight, a queued request waits at most max_delay_us (and
// here idle_us) for company before the second worker launches it.
TEST_F(BatcherTest, QueuedRequestLaunchesAfterTheDelay) {
  BatcherOptions o;
  o.threads = 2;
  o.defaults.max_delay_us = 20'000;
  o.defaults.idle_us = 0;
  std::unique_ptr<OpScheduler> s = Make(o);
  Result busy, waiting;
  ASSERT_TRUE(Submit(*s, MakeRandomRequest("gelu", DType::kF32, {1, 8}, 1), &busy).ok());
  backend_.WaitLaunches(1);
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(Submit(*s, MakeRandomRequest("gelu", DType::kF32, {1, 8}, 2), &waiting).ok());
  backend_.WaitLaunches(2);
  const absl::Duration waited = absl::Now() - t0;
  EXPECT_GE(waited, absl::Milliseconds(19));
  EXPECT_LT(waited, absl::Milliseconds(500));
  backend_.Open();
  busy.done.WaitForNotification();
  waiting.done.WaitForNotification();
}

// A merged launch the backend refuses is retried request by request.
TEST_F(BatcherTest, FailedMergedLaunchFallsBackToSingleRuns) {
  std::unique_ptr<OpScheduler> s = Make(SlowOptions());
  backend_.FailMerged();
  const OpRequest r = MakeRandomRequest("linear", DType::kF32, {1, 8, 16}, 1);
  std::vector<Result> results(4);
  for (Result& x : results) ASSERT_TRUE(Submit(*s, r, &x).ok());
  backend_.Open();
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const std::string want = cpu->Run(r)->at("y").data;
  for (Result& x : results) {
    x.done.WaitForNotification();
    ASSERT_TRUE(x.value.ok()) << x.value.status();
    EXPECT_TRUE(x.value->at("y").data == want);
  }
}

TEST_F(BatcherTest, ShutdownRunsWhatIsQueuedThenRefuses) {
  std::unique_ptr<OpScheduler> s = Make(SlowOptions());
  const OpRequest r = MakeRandomRequest("softmax", DType::kF32, {1, 8}, 1);
  std::vector<Result> results(5);
  for (Result& x : results) ASSERT_TRUE(Submit(*s, r, &x).ok());
  std::thread opener([&] {
    absl::SleepFor(absl::Milliseconds(20));
    backend_.Open();
  });
  s->Shutdown();
  opener.join();
  for (Result& x : results) {
    ASSERT_TRUE(x.done.HasBeenNotified());
    EXPECT_TRUE(x.value.ok());
  }
  Result after;
  EXPECT_EQ(Submit(*s, r, &after).code(), absl::StatusCode::kUnavailable);
}

// With inline_launches (the CUDA backend's small-op lanes), that many small
// requests run inline at once, each on its own submitting thread, beside the
// workers' launch slot; the next one, with every lane busy, queues for a
// worker (and would batch).
TEST_F(BatcherTest, InlineLanesRunSideBySideThenQueue) {
  BatcherOptions o = SlowOptions();
  o.inline_max_bytes = 1 << 20;
  o.inline_launches = 3;
  std::unique_ptr<OpScheduler> s = Make(o);
  std::vector<Result> results(4);
  std::vector<std::thread::id> submitters(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      submitters[i] = std::this_thread::get_id();
      EXPECT_TRUE(Submit(*s, MakeRandomRequest("rms_norm", DType::kF32, {1, 64}, 300 + i), &results[i]).ok());
    });
  }
  backend_.WaitLaunches(3);  // three inline launches inside the (closed) backend at once
  // Lanes busy: queued, not run here.
  ASSERT_TRUE(Submit(*s, MakeRandomRequest("rms_norm", DType::kF32, {1, 64}, 303), &results[3]).ok());
  backend_.WaitLaunches(4);  // a worker took it (its slot was free)
  backend_.Open();
  for (std::thread& t : threads) t.join();
  for (Result& r : results) {
    r.done.WaitForNotification();
    EXPECT_TRUE(r.value.ok()) << r.value.status();
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(results[i].answered_on, submitters[i]) << i;
  EXPECT_NE(results[3].answered_on, std::this_thread::get_id());
  for (int i = 0; i < 3; ++i) EXPECT_NE(results[3].answered_on, submitters[i]);
}

// Many threads, many shapes and ops at once: every answer is the caller's own
// (batcher or direct scheduler; lone requests queued for a worker, or run
// inline on the submitting thread).
enum class Sched { kBatcher, kBatcherInline, kDirectInline };
void StressConcurrentCallers(Sched kind) {
  Metrics metrics;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const int64_t inline_bytes = kind == Sched::kBatcher ? 0 : int64_t{1} << 20;
  absl::StatusOr<std::unique_ptr<OpScheduler>> s;
  if (kind == Sched::kDirectInline) {
    DirectSchedulerOptions d;
    d.threads = 2;
    d.inline_max_bytes = inline_bytes;
    s = MakeDirectScheduler(cpu.get(), &metrics, d);
  } else {
    BatcherOptions o;
    o.threads = 2;
    o.defaults.max_delay_us = 300;
    o.inline_max_bytes = inline_bytes;
    s = MakeBatcher(cpu.get(), &metrics, o);
  }
  ASSERT_TRUE(s.ok());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"rms_norm", {0, 64}}, {"softmax", {0, 32}}, {"rope", {0, 4, 2, 16}}, {"attention", {0, 2, 1, 8}}};
  std::vector<OpRequest> weights_from;
  for (const auto& [op, key] : shapes) {
    std::vector<int64_t> k = key;
    k[0] = 1;
    weights_from.push_back(MakeRandomRequest(op, DType::kBF16, k, 5));
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const size_t which = static_cast<size_t>(t + i) % shapes.size();
        std::vector<int64_t> k = shapes[which].second;
        k[0] = 1 + (t * 7 + i) % 5;
        OpRequest r = MakeRandomRequest(shapes[which].first, DType::kBF16, k, 1000 * t + i);
        if (r.has("weight")) r.inputs["weight"] = weights_from[which].in("weight");
        const TensorMap want = *cpu->Run(r);
        absl::Notification n;
        absl::StatusOr<TensorMap> got;
        OpTask task;
        task.request = r;
        task.enqueued = absl::Now();
        task.done = [&](absl::StatusOr<TensorMap> v) {
          got = std::move(v);
          n.Notify();
        };
        if (!(*s)->Submit(std::move(task)).ok()) {
          ++bad;
          continue;
        }
        n.WaitForNotification();
        if (!got.ok() || got->size() != want.size()) {
          ++bad;
          continue;
        }
        for (const auto& [name, w] : want) {
          if (got->at(name).data != w.data || got->at(name).shape != w.shape) ++bad;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(BatcherStress, ConcurrentCallersGetTheirOwnRows) { StressConcurrentCallers(Sched::kBatcher); }
TEST(BatcherStress, ConcurrentCallersGetTheirOwnRowsWithInlineRuns) { StressConcurrentCallers(Sched::kBatcherInline); }
TEST(DirectSchedulerStress, ConcurrentCallersWithInlineRuns) { StressConcurrentCallers(Sched::kDirectInline); }

// With inline_max_bytes, an idle scheduler answers a small row-wise request
// on the submitting thread, before Submit returns; a GEMM or a request above
// the limit still goes to a worker.
void InlineRuns(bool batching) {
  Metrics metrics;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  absl::StatusOr<std::unique_ptr<OpScheduler>> s;
  constexpr int64_t kLimit = 4096;
  if (batching) {
    BatcherOptions o;
    o.inline_max_bytes = kLimit;
    s = MakeBatcher(cpu.get(), &metrics, o);
  } else {
    DirectSchedulerOptions d;
    d.inline_max_bytes = kLimit;
    s = MakeDirectScheduler(cpu.get(), &metrics, d);
  }
  ASSERT_TRUE(s.ok());
  auto ran_on = [&](const OpRequest& r) {
    absl::Notification n;
    std::thread::id id;
    bool ok = false;
    OpTask task;
    task.request = r;
    task.enqueued = absl::Now();
    task.done = [&](absl::StatusOr<TensorMap> v) {
      id = std::this_thread::get_id();
      ok = v.ok();
      n.Notify();
    };
    EXPECT_TRUE((*s)->Submit(std::move(task)).ok());
    // Which thread answered is the observable; whether Submit had returned by
    // then is not (a worker can answer a queued request before the caller looks).
    n.WaitForNotification();
    EXPECT_TRUE(ok);
    return id;
  };
  const std::thread::id me = std::this_thread::get_id();
  EXPECT_EQ(ran_on(MakeRandomRequest("rms_norm", DType::kF32, {2, 16}, 3)), me);
  EXPECT_NE(ran_on(MakeRandomRequest("rms_norm", DType::kF32, {64, 64}, 4)), me);  // 16 KiB > limit
  EXPECT_NE(ran_on(MakeRandomRequest("linear", DType::kF32, {2, 4, 4}, 5)), me);   // GEMMs never inline
  // A deadline that passed is still answered DEADLINE_EXCEEDED, inline too.
  OpTask late;
  late.request = MakeRandomRequest("rms_norm", DType::kF32, {2, 16}, 6);
  late.enqueued = absl::Now();
  late.deadline = absl::Now() - absl::Milliseconds(1);
  absl::StatusCode code = absl::StatusCode::kOk;
  late.done = [&](absl::StatusOr<TensorMap> v) { code = v.status().code(); };
  ASSERT_TRUE((*s)->Submit(std::move(late)).ok());
  (*s)->Shutdown();
  EXPECT_EQ(code, absl::StatusCode::kDeadlineExceeded);
}

TEST(InlineRuns, BatcherRunsSmallRowWiseRequestsOnTheCallersThread) { InlineRuns(true); }
TEST(InlineRuns, DirectSchedulerRunsSmallRowWiseRequestsOnTheCallersThread) { InlineRuns(false); }

}  // namespace
}  // namespace fusedserve
