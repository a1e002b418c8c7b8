// The dynamic batcher (see batcher.h for the policy): per-key FIFO queues,
// worker threads that pick the oldest launchable key, merge its requests into
// one OpRequest, run it once and split the outputs back.
#include "server/batcher.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/hash/hash.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "kernels/clock.h"

namespace fusedserve {
namespace {

// The op's batch layout (OpSpec::layout), or nullptr when it is unknown.
const RowLayout* LayoutOf(const OpRequest& r) { return r.spec == nullptr ? nullptr : &r.spec->layout; }

bool IsConcat(const RowLayout& l, const std::string& name) {
  return std::find(l.concat.begin(), l.concat.end(), name) != l.concat.end();
}

// Rows of `t` along the concatenation axis.
int64_t RowsOf(const RowLayout& l, const HostTensor& t) {
  if (t.rank() == 0) return 1;
  if (l.flatten) return t.numel() / std::max<int64_t>(t.dim(-1), 1);
  return t.dim(0);
}

// Shape of `t` without its row dim.
std::vector<int64_t> TrailingShape(const RowLayout& l, const HostTensor& t) {
  if (t.rank() == 0) return {};
  if (l.flatten) return {t.dim(-1)};
  return std::vector<int64_t>(t.shape.begin() + 1, t.shape.end());
}

void AppendAttr(std::string* key, const std::string& name, const AttrValue& v) {
  absl::StrAppend(key, name, "=", v.index(), ":");
  if (const double* f = std::get_if<double>(&v)) {
    uint64_t bits;
    std::memcpy(&bits, f, sizeof(bits));
    absl::StrAppend(key, bits);
  } else if (const int64_t* i = std::get_if<int64_t>(&v)) {
    absl::StrAppend(key, *i);
  } else if (const std::string* s = std::get_if<std::string>(&v)) {
    absl::StrAppend(key, s->size(), ":", *s);
  } else {
    absl::StrAppend(key, std::get<bool>(v) ? 1 : 0);
  }
  key->push_back(';');
}

absl::Status Invalid(const std::string& msg) { return absl::InvalidArgumentError("--batch_overrides: " + msg); }

}  // namespace

std::optional<BatchShape> BatchShapeOf(const OpRequest& r) {
  const RowLayout* l = LayoutOf(r);
  if (l == nullptr || !r.has(l->primary)) return std::nullopt;
  BatchShape out;
  out.rows = RowsOf(*l, r.in(l->primary));
  std::string& key = out.key;
  absl::StrAppend(&key, r.op, "|");
  for (const auto& [name, t] : r.inputs) {
    absl::StrAppend(&key, name, ":", static_cast<int>(t.dtype), "[");
    if (IsConcat(*l, name)) {
      if (t.rank() == 0) return std::nullopt;
      for (int64_t d : TrailingShape(*l, t)) absl::StrAppend(&key, d, ",");
    } else {
      for (int64_t d : t.shape) absl::StrAppend(&key, d, ",");
      // Hash of the bytes (absl::Hash: ~10x faster than std::hash on long
      // strings, and seeded per process); requests are compared byte-wise
      // before they share a launch, so a collision never mixes weights.
      absl::StrAppend(&key, "#", absl::Hash<absl::string_view>()(absl::string_view(t.bytes().data(), t.nbytes())));
    }
    key += "];";
  }
  key += "|";
  for (const auto& [name, v] : r.attrs) AppendAttr(&key, name, v);
  return out;
}

bool SameNonRowInputs(const OpRequest& a, const OpRequest& b) {
  const RowLayout* l = LayoutOf(a);
  if (l == nullptr || a.spec != b.spec || a.inputs.size() != b.inputs.size()) return false;
  for (const auto& [name, t] : a.inputs) {
    if (IsConcat(*l, name)) continue;
    auto it = b.inputs.find(name);
    if (it == b.inputs.end() || it->second.dtype != t.dtype || it->second.shape != t.shape ||
        it->second.bytes() != t.bytes()) {
      return false;
    }
  }
  return true;
}

OutputLayout OutputLayoutOf(const OpRequest& r) {
  OutputLayout out;
  const RowLayout* l = LayoutOf(r);
  out.rows = l == nullptr ? 0 : RowsOf(*l, r.in(l->primary));
  out.shapes = OutputShapes(r);
  return out;
}

OpRequest MergeRequests(const std::vector<OpRequest*>& parts) {
  OpRequest& first = *parts.front();
  const RowLayout& l = first.spec->layout;
  OpRequest m;
  m.op = first.op;
  m.spec = first.spec;
  m.attrs = first.attrs;
  for (auto& [name, t] : first.inputs) {
    if (!IsConcat(l, name)) {
      m.inputs[name] = std::move(t);  // weights: moved, restored by RestoreNonRowInputs
      continue;
    }
    HostTensor cat;
    cat.dtype = t.dtype;
    int64_t rows = 0;
    size_t bytes = 0;
    for (const OpRequest* p : parts) {
      const HostTensor& pt = p->in(name);
      rows += RowsOf(l, pt);
      bytes += pt.nbytes();
    }
    cat.data.reserve(bytes);
    for (const OpRequest* p : parts) cat.data += p->in(name).bytes();
    cat.shape = {rows};
    for (int64_t d : TrailingShape(l, t)) cat.shape.push_back(d);
    m.inputs[name] = std::move(cat);
  }
  return m;
}

void RestoreNonRowInputs(OpRequest& merged, OpRequest& first) {
  const RowLayout& l = first.spec->layout;
  for (auto& [name, t] : merged.inputs) {
    if (!IsConcat(l, name)) first.inputs[name] = std::move(t);
  }
}

absl::StatusOr<std::vector<TensorMap>> SplitOutputs(const std::vector<OutputLayout>& parts, TensorMap merged) {
  std::vector<TensorMap> out(parts.size());
  int64_t total_rows = 0;
  for (const OutputLayout& p : parts) total_rows += p.rows;
  if (total_rows <= 0) return absl::InternalError("batcher: merged launch has no rows");
  for (auto& [name, t] : merged) {
    t.Own();  // outputs may be views into a staging block; the split works on owned bytes
    if (t.data.size() % static_cast<size_t>(total_rows) != 0) {
      return absl::InternalError(absl::StrCat("batcher: output '", name, "' has ", t.data.size(),
                                              " bytes, not a multiple of ", total_rows, " rows"));
    }
    const size_t row_bytes = t.data.size() / static_cast<size_t>(total_rows);
    size_t offset = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::vector<int64_t>* shape = nullptr;
      for (const auto& [n, s] : parts[i].shapes) {
        if (n == name) shape = &s;
      }
      if (shape == nullptr) return absl::InternalError("batcher: unexpected output '" + name + "'");
      HostTensor piece;
      piece.dtype = t.dtype;
      piece.shape = *shape;
      const size_t bytes = static_cast<size_t>(parts[i].rows) * row_bytes;
      if (static_cast<size_t>(piece.numel()) * DTypeSize(piece.dtype) != bytes) {
        return absl::InternalError(absl::StrCat("batcher: output '", name, "' of part ", i, " has ", bytes,
                                                " bytes, its shape needs ", piece.numel() * DTypeSize(piece.dtype)));
      }
      if (parts.size() == 1) {
        piece.data = std::move(t.data);
      } else {
        piece.data.assign(t.data, offset, bytes);
      }
      offset += bytes;
      out[i][name] = std::move(piece);
    }
  }
  return out;
}

// ---- flags -------------------------------------------------------------------

absl::StatusOr<std::vector<int64_t>> ParseRowList(const std::string& spec, char sep) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(spec, sep, absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat("bad row count '", part, "' (expected integers >= 1)"));
    }
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<std::map<std::string, BatchPolicy>> ParseBatchOverrides(const std::string& spec,
                                                                       const BatchPolicy& base) {
  std::map<std::string, BatchPolicy> out;
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> fields = absl::StrSplit(entry, ':');
    const std::string op(fields[0]);
    if (FindOpSpec(op) == nullptr) return Invalid("unknown op '" + op + "'");
    BatchPolicy p = out.count(op) ? out[op] : base;
    for (size_t i = 1; i < fields.size(); ++i) {
      std::pair<std::string, std::string> kv = absl::StrSplit(fields[i], absl::MaxSplits('=', 1));
      const std::string& k = kv.first;
      int64_t v = 0;
      if (k == "preferred") {
        absl::StatusOr<std::vector<int64_t>> rows = ParseRowList(kv.second, '/');
        if (!rows.ok()) return Invalid(op + ": preferred: " + std::string(rows.status().message()));
        p.preferred_rows = *rows;
        continue;
      }
      if (!absl::SimpleAtoi(kv.second, &v) || v < 0) {
        return Invalid(absl::StrCat(op, ": '", fields[i], "' needs a value >= 0"));
      }
      if (k == "max_rows" && v >= 1) {
        p.max_rows = v;
      } else if (k == "delay_us") {
        p.max_delay_us = v;
      } else if (k == "idle_us") {
        p.idle_us = v;
      } else if (k == "max_queue") {
        p.max_queue = static_cast<int>(v);
      } else {
        return Invalid(absl::StrCat(op, ": unknown or invalid setting '", fields[i],
                                    "' (expected max_rows>=1, delay_us, idle_us, max_queue, preferred=a/b/c)"));
      }
    }
    out[op] = p;
  }
  return out;
}

// ---- the scheduler -----------------------------------------------------------

namespace {

struct Pending {
  OpTask task;
  int64_t rows = 0;
  int64_t bytes = 0;  // QueuedBytes
  OpCost cost;
};

struct KeyQueue {
  std::deque<Pending> q;
  int64_t rows = 0;  // sum over q
  bool batchable = true;
  absl::Time last_arrival;
  const BatchPolicy* policy = nullptr;
};

// Rows worth launching without waiting.
int64_t TargetRows(const BatchPolicy& p) {
  int64_t t = p.max_rows;
  if (!p.preferred_rows.empty()) t = std::min(t, p.preferred_rows.back());
  return std::max<int64_t>(t, 1);
}

class Batcher : public OpScheduler {
 public:
  Batcher(Backend* backend, Metrics* metrics, const BatcherOptions& options)
      : backend_(backend), metrics_(metrics), options_(options) {
    for (int i = 0; i < std::max(1, options.threads); ++i) workers_.emplace_back([this] { Work(); });
  }
  ~Batcher() override { Shutdown(); }

  absl::Status Submit(OpTask task) override {
    if (RunsInline(task.request, options_.inline_max_bytes)) {
      absl::ReleasableMutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("server is shutting down");
      const bool lanes = options_.inline_launches > 0;
      if (queued_ == 0 &&
          (lanes ? inline_running_ < options_.inline_launches : running_ < options_.parallel_launches)) {
        // The backend has a free launch slot (or lane) and nothing waits: the
        // launch rule would start this request at once; start it here
        // instead of waking a worker. Counted in running_ like a worker's
        // launch (or in inline_running_ on lanes); Launch releases it. Only
        // while a slot is free, so at most that many gRPC threads are ever
        // busy with a launch and under load requests still reach the queue
        // (and batch). (Neither keyed nor costed: a lone launch needs neither.)
        ++(lanes ? inline_running_ : running_);
        lock.Release();
        metrics_->inline_launches().Increment();
        std::vector<Pending> batch(1);
        batch[0].task = std::move(task);
        Launch(std::move(batch), lanes);
        return absl::OkStatus();
      }
    }
    // Keying hashes the weights: do it before taking the lock.
    std::optional<BatchShape> shape = BatchShapeOf(task.request);
    const std::string op = task.request.op;
    const BatchPolicy& policy = options_.policy(op);
    const int64_t rows = shape ? shape->rows : 1;
    const int64_t bytes = QueuedBytes(task.request);
    const OpCost cost = EstimateCost(task.request);
    Pending pending{std::move(task), rows, bytes, cost};
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("server is shutting down");
    if (queued_ >= options_.max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("request queue is full (", options_.max_queue, " queued); retry later"));
    }
    int& op_queued = op_queued_[op];
    if (policy.max_queue > 0 && op_queued >= policy.max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("request queue for ", op, " is full (", policy.max_queue, " queued); retry later"));
    }
    if (absl::Status s = CheckQueuedBytes(queued_bytes_, bytes, options_.max_queued_bytes); !s.ok()) return s;
    const std::string key = shape ? shape->key : absl::StrCat("\x01solo", next_solo_++);
    KeyQueue& kq = queues_[key];
    if (kq.q.empty()) {
      kq.batchable = shape.has_value();
      kq.policy = &policy;
    }
    kq.last_arrival = FastNow();
    kq.rows += rows;
    kq.q.push_back(std::move(pending));
    ++queued_;
    ++op_queued;
    queued_bytes_ += bytes;
    metrics_->queued_bytes().Increment(static_cast<double>(bytes));
    metrics_->QueueDepth(op).Increment();
    cv_.Signal();
    return absl::OkStatus();
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ && workers_.empty()) return;
      stopping_ = true;
      cv_.SignalAll();
    }
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    // Inline launches still on gRPC threads.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Batcher* b) { return b->running_ == 0 && b->inline_running_ == 0; }, this));
  }

 private:
  // When the queue may launch: now, or the time it becomes launchable.
  absl::Time ReadyAt(const KeyQueue& kq, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const BatchPolicy& p = *kq.policy;
    if (stopping_ || !kq.batchable || running_ < options_.parallel_launches || kq.rows >= TargetRows(p)) {
      return now;
    }
    absl::Time t = kq.q.front().task.enqueued + absl::Microseconds(p.max_delay_us);
    if (p.idle_us > 0) t = std::min(t, kq.last_arrival + absl::Microseconds(p.idle_us));
    return t;
  }

  void Work() {
    // Default timer slack (50 µs) would stretch every short batching wait.
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    prctl(PR_SET_NAME, "fs-batch", 0, 0, 0);
    mu_.Lock();
    for (;;) {
      const absl::Time now = FastNow();
      absl::Time wake = absl::InfiniteFuture();
      auto pick = queues_.end();
      for (auto it = queues_.begin(); it != queues_.end(); ++it) {
        const absl::Time ready = ReadyAt(it->second, now);
        if (ready > now) {
          wake = std::min(wake, ready);
        } else if (pick == queues_.end() || it->second.q.front().task.enqueued < pick->second.q.front().task.enqueued) {
          pick = it;
        }
      }
      if (pick == queues_.end()) {
        if (stopping_ && queued_ == 0) break;
        // One worker sleeps on the earliest batching deadline; the others
        // wait for a signal (no herd of idle workers waking every few µs).
        if (wake < timer_) {
          timer_ = wake;
          cv_.WaitWithDeadline(&mu_, wake);
          if (timer_ == wake) timer_ = absl::InfiniteFuture();
        } else {
          cv_.Wait(&mu_);
        }
        continue;
      }
      std::vector<Pending> batch = TakeBatch(pick);
      ++running_;  // counted from now, so no other worker sees spare capacity meanwhile
      // Something may be launchable still (the rest of a long queue, another key).
      if (!queues_.empty()) cv_.Signal();
      mu_.Unlock();
      Launch(std::move(batch));
      mu_.Lock();
    }
    mu_.Unlock();
  }

  // Pops the head and every following request that fits within the cap and
  // the launch cost bounds. The cap is the largest preferred size the queue
  // reaches (so kernels see the sizes they were tuned for), else max_rows.
  std::vector<Pending> TakeBatch(std::map<std::string, KeyQueue>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    KeyQueue& kq = it->second;
    int64_t cap = 0;
    if (kq.batchable) {
      const BatchPolicy& p = *kq.policy;
      cap = p.max_rows;
      for (int64_t preferred : p.preferred_rows) {
        if (preferred <= std::min(kq.rows, p.max_rows)) cap = preferred;
      }
    }
    std::vector<Pending> batch;
    int64_t rows = 0;
    OpCost cost;
    while (!kq.q.empty()) {
      Pending& next = kq.q.front();
      const bool within_cost =
          cost.flops + next.cost.flops <= options_.max_launch_flops &&
          cost.output_bytes + cost.scratch_bytes + next.cost.output_bytes + next.cost.scratch_bytes <=
              options_.max_launch_bytes;
      if (!batch.empty() && (!kq.batchable || rows + next.rows > cap || !within_cost)) break;
      rows += next.rows;
      cost.flops += next.cost.flops;
      cost.output_bytes += next.cost.output_bytes;
      cost.scratch_bytes += next.cost.scratch_bytes;
      kq.rows -= next.rows;
      --queued_;
      queued_bytes_ -= next.bytes;
      metrics_->queued_bytes().Decrement(static_cast<double>(next.bytes));
      --op_queued_[next.task.request.op];
      metrics_->QueueDepth(next.task.request.op).Decrement();
      batch.push_back(std::move(next));
      kq.q.pop_front();
    }
    if (kq.q.empty()) queues_.erase(it);
    return batch;
  }

  // Ends a launch's claim on the backend: when the running count drops below
  // parallel_launches, a waiting worker launches what has queued meanwhile.
  // An inline launch on a lane of its own (`lane`) frees that lane only.
  void Release(bool lane) {
    absl::MutexLock lock(&mu_);
    if (lane) {
      --inline_running_;
      return;
    }
    if (--running_ < options_.parallel_launches && !queues_.empty()) cv_.Signal();
  }

  // backend_->Run; `*counted` says whether running_ already counts this call
  // (the first call of a launch is counted when its batch is taken).
  // RunOnBackend for the launch serving `tasks`; see scheduler.h for `stopped`.
  absl::StatusOr<TensorMap> RunBackend(const OpRequest& request, const std::vector<const OpTask*>& tasks,
                                       std::vector<absl::Status>* stopped, bool* counted, bool lane = false) {
    if (!*counted) {
      absl::MutexLock lock(&mu_);
      ++running_;
    }
    absl::StatusOr<TensorMap> result = RunOnBackend(*backend_, request, tasks, stopped);
    RecordLaunchStages(*metrics_);
    *counted = false;
    Release(lane);
    return result;
  }

  // One request run alone.
  void RunAlone(OpTask* t, bool* counted, bool lane = false) {
    const absl::Time start = FastNow();
    std::vector<absl::Status> stopped;
    absl::StatusOr<TensorMap> one = RunBackend(t->request, {t}, &stopped, counted, lane);
    metrics_->RecordKernel(t->request.op, absl::ToDoubleSeconds(FastNow() - start));
    metrics_->RecordBatch(t->request.op, 1);
    AnswerGroupScope scope({t});
    t->done(std::move(one));
  }

  // `lane`: a lone inline request on a lane of its own (see Release).
  void Launch(std::vector<Pending> batch, bool lane = false) {
    const absl::Time start = FastNow();
    bool counted = true;
    const std::string op = batch.front().task.request.op;
    std::vector<OpTask*> run;
    for (Pending& p : batch) {
      metrics_->RecordQueue(op, absl::ToDoubleSeconds(start - p.task.enqueued));
      if (absl::Status s = CheckRunnable(p.task, start); !s.ok()) {
        p.task.done(s);
        p.task.done = nullptr;
        continue;
      }
      run.push_back(&p.task);
    }
    if (run.empty()) {
      Release(lane);
      return;
    }
    if (run.size() == 1) {
      RunAlone(run[0], &counted, lane);
      return;
    }
    // Same key means same weight hash; confirm the bytes here, outside the
    // lock (a 32 MB weight takes milliseconds). A mismatch runs alone.
    std::vector<OpTask*> odd;
    run.erase(std::remove_if(run.begin() + 1, run.end(),
                             [&](OpTask* t) {
                               if (SameNonRowInputs(run.front()->request, t->request)) return false;
                               odd.push_back(t);
                               return true;
                             }),
              run.end());
    for (OpTask* t : odd) RunAlone(t, &counted);
    if (run.size() == 1) {
      RunAlone(run[0], &counted);
      return;
    }
    std::vector<OutputLayout> layouts;
    std::vector<OpRequest*> parts;
    std::vector<const OpTask*> tasks(run.begin(), run.end());
    for (OpTask* t : run) {
      layouts.push_back(OutputLayoutOf(t->request));
      parts.push_back(&t->request);
    }
    OpRequest merged = MergeRequests(parts);
    std::vector<absl::Status> stopped;
    absl::StatusOr<TensorMap> result = RunBackend(merged, tasks, &stopped, &counted);
    metrics_->RecordKernel(op, absl::ToDoubleSeconds(FastNow() - start));
    if (!stopped.empty()) {  // every part was cancelled or expired: each gets its own reason
      AnswerGroupScope scope(run);
      for (size_t i = 0; i < run.size(); ++i) run[i]->done(stopped[i]);
      return;
    }
    absl::StatusOr<std::vector<TensorMap>> split =
        result.ok() ? SplitOutputs(layouts, *std::move(result)) : result.status();
    if (split.ok()) {
      metrics_->RecordBatch(op, static_cast<int>(run.size()));
      AnswerGroupScope scope(run);
      for (size_t i = 0; i < run.size(); ++i) run[i]->done(std::move((*split)[i]));
      return;
    }
    // The merged launch failed (e.g. a size only the merged batch reaches is
    // unsupported): run each request alone, so the merge never changes an answer.
    RestoreNonRowInputs(merged, *parts.front());
    for (OpTask* t : run) RunAlone(t, &counted);
  }

  Backend* const backend_;
  Metrics* const metrics_;
  const BatcherOptions options_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::map<std::string, KeyQueue> queues_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> op_queued_ ABSL_GUARDED_BY(mu_);
  int queued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;         // launches inside backend_->Run
  int inline_running_ ABSL_GUARDED_BY(mu_) = 0;  // inline launches on lanes (inline_launches), not in running_
  uint64_t next_solo_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time timer_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<OpScheduler>> MakeBatcher(Backend* backend, Metrics* metrics,
                                                         const BatcherOptions& options) {
  auto check = [](const std::string& who, const BatchPolicy& p) -> absl::Status {
    if (p.max_rows < 1) return absl::InvalidArgumentError(who + ": max_rows must be >= 1");
    if (p.max_delay_us < 0 || p.idle_us < 0) return absl::InvalidArgumentError(who + ": delays must be >= 0");
    return absl::OkStatus();
  };
  if (options.max_queue < 1) return absl::InvalidArgumentError("--max_queue must be >= 1");
  if (options.parallel_launches < 1) return absl::InvalidArgumentError("parallel launches must be >= 1");
  if (absl::Status s = check("batching defaults", options.defaults); !s.ok()) return s;
  for (const auto& [op, p] : options.per_op) {
    if (FindOpSpec(op) == nullptr) return absl::InvalidArgumentError("batch override for unknown op '" + op + "'");
    if (absl::Status s = check(op, p); !s.ok()) return s;
  }
  return std::unique_ptr<OpScheduler>(new Batcher(backend, metrics, options));
}

}  // namespace fusedserve
