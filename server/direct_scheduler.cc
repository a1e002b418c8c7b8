// The direct scheduler: a bounded FIFO in front of a fixed pool of workers,
// one backend call per request. Small requests that find the scheduler idle
// run inline on the submitting thread (options.inline_max_bytes).
#include <sys/prctl.h>

#include <deque>
#include <new>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/clock.h"
#include "server/scheduler.h"

namespace fusedserve {

absl::Status CheckRunnable(const OpTask& task, absl::Time now) {
  // The deadline first: gRPC also marks an expired call cancelled.
  if (now > task.deadline) return absl::DeadlineExceededError("the request's deadline passed before it finished");
  if (task.interrupted) return task.interrupted();
  return absl::OkStatus();
}

int64_t QueuedBytes(const OpRequest& request) {
  int64_t bytes = 0;
  for (const auto& [name, t] : request.inputs) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

absl::Status CheckQueuedBytes(int64_t queued, int64_t bytes, int64_t max_queued_bytes) {
  if (queued + bytes <= max_queued_bytes || queued == 0) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("queued requests hold ", queued, " bytes; ", bytes,
                                                   " more would pass the server's limit of ", max_queued_bytes,
                                                   " (--max_queued_bytes); retry later"));
}

absl::StatusOr<TensorMap> RunOnBackend(Backend& backend, const OpRequest& request,
                                       const std::vector<const OpTask*>& tasks, std::vector<absl::Status>* stopped) {
  stopped->clear();
  // Stop only when no task still wants the answer (a merged launch serves all).
  auto stop = [&tasks, stopped]() -> absl::Status {
    const absl::Time now = FastNow();
    std::vector<absl::Status> each;
    for (const OpTask* t : tasks) {
      absl::Status s = CheckRunnable(*t, now);
      if (s.ok()) return s;
      each.push_back(std::move(s));
    }
    *stopped = std::move(each);
    return stopped->front();
  };
  BackendStageTimes& times = ThisThreadStageTimes();
  times = BackendStageTimes();
  const absl::Time start = FastNow();
  try {
    // A task's own request (not a merged one) may run its host work under the launch.
    static const WhileRunning kNone;
    const bool alone = tasks.size() == 1 && &tasks.front()->request == &request;
    absl::StatusOr<TensorMap> result = backend.Run(request, stop, alone ? tasks.front()->while_running : kNone);
    if (!times.valid) times = {true, 0, absl::ToDoubleSeconds(FastNow() - start), 0};
    if (result.ok()) stopped->clear();
    return result;
  } catch (const std::bad_alloc&) {
    stopped->clear();
    return absl::ResourceExhaustedError(
        absl::StrCat(request.op, ": out of host memory while running the request; retry later or send less"));
  }
}

void RecordLaunchStages(Metrics& metrics) {
  const BackendStageTimes& t = ThisThreadStageTimes();
  if (!t.valid) return;
  metrics.RecordStage(Metrics::Stage::kH2D, t.h2d);
  metrics.RecordStage(Metrics::Stage::kKernel, t.kernel);
  metrics.RecordStage(Metrics::Stage::kD2H, t.d2h);
}

namespace {
thread_local bool t_answers_share_one_group = false;
}  // namespace

bool LaunchAnswersShareOneGroup() { return t_answers_share_one_group; }

AnswerGroupScope::AnswerGroupScope(const std::vector<OpTask*>& tasks) {
  const void* group = tasks.empty() ? nullptr : tasks.front()->answer_group;
  bool one = group != nullptr;
  for (const OpTask* t : tasks) one = one && t->answer_group == group;
  t_answers_share_one_group = one;
}
AnswerGroupScope::~AnswerGroupScope() { t_answers_share_one_group = false; }

bool RunsInline(const OpRequest& request, int64_t max_bytes) {
  if (max_bytes <= 0 || request.spec == nullptr || !request.spec->memory_bound) return false;
  return QueuedBytes(request) <= max_bytes;
}

namespace {

class DirectScheduler : public OpScheduler {
 public:
  DirectScheduler(Backend* backend, Metrics* metrics, const DirectSchedulerOptions& options)
      : backend_(backend), metrics_(metrics), options_(options) {
    for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~DirectScheduler() override { Shutdown(); }

  absl::Status Submit(OpTask task) override {
    const bool may_inline = RunsInline(task.request, options_.inline_max_bytes);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("server is shutting down");
      // Inline only from idle: at most one gRPC thread is ever busy with a
      // backend call, so under load gRPC keeps reading and requests queue.
      if (!(may_inline && queue_.empty() && running_ == 0)) {
        if (static_cast<int>(queue_.size()) >= options_.max_queue) {
          return absl::ResourceExhaustedError("request queue is full (" + std::to_string(options_.max_queue) +
                                              " queued); retry later");
        }
        const int64_t bytes = QueuedBytes(task.request);
        if (absl::Status s = CheckQueuedBytes(queued_bytes_, bytes, options_.max_queued_bytes); !s.ok()) return s;
        queued_bytes_ += bytes;
        metrics_->queued_bytes().Increment(static_cast<double>(bytes));
        metrics_->QueueDepth(task.request.op).Increment();
        queue_.push_back(std::move(task));
        return absl::OkStatus();
      }
      ++running_;  // an inline run holds a worker slot like a worker does
    }
    metrics_->inline_launches().Increment();
    Execute(task);
    absl::MutexLock lock(&mu_);
    --running_;
    return absl::OkStatus();
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ && workers_.empty()) return;
      stopping_ = true;
    }
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    // Inline runs still on gRPC threads.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](DirectScheduler* s) { return s->running_ == 0; }, this));
  }

 private:
  void Work() {
    prctl(PR_SET_NAME, "fs-worker", 0, 0, 0);
    for (;;) {
      OpTask task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](DirectScheduler* s) { return s->queue_.empty() ? s->stopping_ : s->running_ < s->threads_; }, this));
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
        const int64_t bytes = QueuedBytes(task.request);
        queued_bytes_ -= bytes;
        metrics_->queued_bytes().Decrement(static_cast<double>(bytes));
      }
      metrics_->QueueDepth(task.request.op).Decrement();
      Execute(task);
      absl::MutexLock lock(&mu_);
      --running_;
    }
  }

  void Execute(OpTask& task) {
    const std::string& op = task.request.op;
    const absl::Time start = FastNow();
    metrics_->RecordQueue(op, absl::ToDoubleSeconds(start - task.enqueued));
    if (absl::Status s = CheckRunnable(task, start); !s.ok()) {
      task.done(s);
      return;
    }
    std::vector<absl::Status> stopped;
    absl::StatusOr<TensorMap> result = RunOnBackend(*backend_, task.request, {&task}, &stopped);
    RecordLaunchStages(*metrics_);
    metrics_->RecordKernel(op, absl::ToDoubleSeconds(FastNow() - start));
    metrics_->RecordBatch(op, 1);
    task.done(std::move(result));
  }

  Backend* const backend_;
  Metrics* const metrics_;
  const DirectSchedulerOptions options_;
  const int threads_ = std::max(1, options_.threads);
  absl::Mutex mu_;
  std::deque<OpTask> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // backend calls in progress (workers and inline)
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<OpScheduler> MakeDirectScheduler(Backend* backend, Metrics* metrics,
                                                 const DirectSchedulerOptions& options) {
  return std::make_unique<DirectScheduler>(backend, metrics, options);
}

}  // namespace fusedserve
