// The direct scheduler: a bounded FIFO in front of a fixed pool of workers,
// one backend call per request.
#include <deque>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/scheduler.h"

namespace fusedserve {

absl::Status CheckRunnable(const OpTask& task, absl::Time now) {
  if (task.cancelled && task.cancelled()) return absl::CancelledError("request cancelled while queued");
  if (now > task.deadline) return absl::DeadlineExceededError("deadline passed while the request was queued");
  return absl::OkStatus();
}

namespace {

class DirectScheduler : public OpScheduler {
 public:
  DirectScheduler(Backend* backend, Metrics* metrics, const DirectSchedulerOptions& options)
      : backend_(backend), metrics_(metrics), options_(options) {
    for (int i = 0; i < std::max(1, options.threads); ++i) workers_.emplace_back([this] { Work(); });
  }
  ~DirectScheduler() override { Shutdown(); }

  absl::Status Submit(OpTask task) override {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("server is shutting down");
    if (static_cast<int>(queue_.size()) >= options_.max_queue) {
      return absl::ResourceExhaustedError("request queue is full (" + std::to_string(options_.max_queue) +
                                          " queued); retry later");
    }
    metrics_->QueueDepth(task.request.op).Increment();
    queue_.push_back(std::move(task));
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
  }

 private:
  void Work() {
    for (;;) {
      OpTask task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](DirectScheduler* s) { return s->stopping_ || !s->queue_.empty(); }, this));
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      const std::string& op = task.request.op;
      metrics_->QueueDepth(op).Decrement();
      const absl::Time start = absl::Now();
      metrics_->RecordQueue(op, absl::ToDoubleSeconds(start - task.enqueued));
      if (absl::Status s = CheckRunnable(task, start); !s.ok()) {
        task.done(s);
        continue;
      }
      absl::StatusOr<TensorMap> result = backend_->Run(task.request);
      metrics_->RecordKernel(op, absl::ToDoubleSeconds(absl::Now() - start));
      metrics_->RecordBatch(op, 1);
      task.done(std::move(result));
    }
  }

  Backend* const backend_;
  Metrics* const metrics_;
  const DirectSchedulerOptions options_;
  absl::Mutex mu_;
  std::deque<OpTask> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<OpScheduler> MakeDirectScheduler(Backend* backend, Metrics* metrics,
                                                 const DirectSchedulerOptions& options) {
  return std::make_unique<DirectScheduler>(backend, metrics, options);
}

}  // namespace fusedserve
