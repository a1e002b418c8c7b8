// The direct scheduler: a bounded FIFO in front of a fixed pool of workers,
// one backend call per request. Small requests that find the scheduler idle
// run inline on the submitting thread (options.inline_max_bytes).
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

bool RunsInline(const OpRequest& request, int64_t max_bytes) {
  static const char* const kRowWise[] = {"rms_norm", "add_rms_norm", "add_rms_norm_silu", "layer_norm",
                                         "softmax",  "silu_and_mul", "gelu",              "rope"};
  if (max_bytes <= 0) return false;
  bool row_wise = false;
  for (const char* op : kRowWise) row_wise = row_wise || request.op == op;
  if (!row_wise) return false;
  int64_t bytes = 0;
  for (const auto& [name, t] : request.inputs) bytes += static_cast<int64_t>(t.data.size());
  return bytes <= max_bytes;
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
        metrics_->QueueDepth(task.request.op).Increment();
        queue_.push_back(std::move(task));
        return absl::OkStatus();
      }
      ++running_;  // an inline run holds a worker slot like a worker does
    }
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
    mu_.Await(absl::Condition(+[](DirectScheduler* s) { return s->running_ == 0; }, this));
  }

 private:
  void Work() {
    for (;;) {
      OpTask task;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](DirectScheduler* s) {
              return s->queue_.empty() ? s->stopping_ : s->running_ < s->threads_;
            },
            this));
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
      }
      metrics_->QueueDepth(task.request.op).Decrement();
      Execute(task);
      absl::MutexLock lock(&mu_);
      --running_;
    }
  }

  void Execute(OpTask& task) {
    const std::string& op = task.request.op;
    const absl::Time start = absl::Now();
    metrics_->RecordQueue(op, absl::ToDoubleSeconds(start - task.enqueued));
    if (absl::Status s = CheckRunnable(task, start); !s.ok()) {
      task.done(s);
      return;
    }
    absl::StatusOr<TensorMap> result = backend_->Run(task.request);
    metrics_->RecordKernel(op, absl::ToDoubleSeconds(absl::Now() - start));
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
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<OpScheduler> MakeDirectScheduler(Backend* backend, Metrics* metrics,
                                                 const DirectSchedulerOptions& options) {
  return std::make_unique<DirectScheduler>(backend, metrics, options);
}

}  // namespace fusedserve
