// OpScheduler: where validated FusedOp requests wait for a backend. The
// direct scheduler runs each request on its own (a bounded queue in front of
// worker threads); the dynamic batcher merges compatible requests into one
// launch. Either way a request past its deadline or cancelled while queued is
// dropped before launch, and a full queue answers RESOURCE_EXHAUSTED at once.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "telemetry/metrics.h"

namespace fusedserve {

struct OpTask {
  OpRequest request;
  absl::Time enqueued;
  absl::Time deadline = absl::InfiniteFuture();
  // OK, or why the request must stop now: the client cancelled (CANCELLED),
  // the server's drain ran out of time (UNAVAILABLE). May be empty.
  std::function<absl::Status()> interrupted;
  // Called exactly once if Submit succeeded: from a worker thread, or from
  // inside Submit when the request runs inline (see RunsInline).
  std::function<void(absl::StatusOr<TensorMap>)> done;
  // Host work for while the device runs this task alone (Backend's
  // WhileRunning; not for a merged launch). May be empty.
  WhileRunning while_running;
  // Who would answer the call if not the worker (the async server: its
  // completion queue), or null; see LaunchAnswersShareOneGroup.
  const void* answer_group = nullptr;
};

// True inside `done` when a batcher worker answers the tasks of one launch
// (a merged batch, or one request) that all share one non-null
// answer_group (the direct scheduler never says so: its worker holds a
// launch slot until `done` returns). Their answers cannot go out in parallel anyway (one queue,
// one thread), so the async server lets the worker answer them instead of
// handing each back to that queue's thread, which would then carry every
// call of a busy connection alone (gRPC's poll engine: one connection, one
// queue).
bool LaunchAnswersShareOneGroup();

class OpScheduler {
 public:
  virtual ~OpScheduler() = default;
  // Queues the task; RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE
  // after Shutdown. On error `done` is not called.
  virtual absl::Status Submit(OpTask task) = 0;
  // Runs what is queued, then stops the workers.
  virtual void Shutdown() = 0;
};

struct DirectSchedulerOptions {
  int threads = 4;       // concurrent backend calls
  int max_queue = 1024;  // queued requests before RESOURCE_EXHAUSTED
  // Input bytes of the queued requests before RESOURCE_EXHAUSTED.
  int64_t max_queued_bytes = int64_t{1} << 30;
  // Requests that RunsInline accepts run on the submitting (gRPC) thread when
  // the scheduler is idle (nothing queued or running): no hand-off to a
  // worker. 0 disables.
  int64_t inline_max_bytes = 0;
};

// Whether `request` is cheap enough to run on a gRPC thread: a memory-bound
// row-wise op (norms, softmax, activations, rope) whose inputs total at most
// max_bytes. GEMMs and attention always go to the workers.
bool RunsInline(const OpRequest& request, int64_t max_bytes);

std::unique_ptr<OpScheduler> MakeDirectScheduler(Backend* backend, Metrics* metrics,
                                                 const DirectSchedulerOptions& options);

// Shared by schedulers: the status a queued task gets instead of running,
// or OK when it should run.
absl::Status CheckRunnable(const OpTask& task, absl::Time now);

// The input bytes a queued request holds (what --max_queued_bytes counts).
int64_t QueuedBytes(const OpRequest& request);

// RESOURCE_EXHAUSTED naming --max_queued_bytes when `bytes` more would pass it.
absl::Status CheckQueuedBytes(int64_t queued, int64_t bytes, int64_t max_queued_bytes);

// backend.Run for a launch of `tasks` (one, or the parts of a merged
// request): the backend stops early once every task is interrupted or past
// its deadline, and then each task's own status is returned in `stopped`
// (empty otherwise). A failed allocation (std::bad_alloc) becomes
// RESOURCE_EXHAUSTED for this launch alone.
// Also leaves the launch's stage times in ThisThreadStageTimes() (the whole
// call as "kernel" when the backend does not split it) for RecordLaunchStages.
absl::StatusOr<TensorMap> RunOnBackend(Backend& backend, const OpRequest& request,
                                       const std::vector<const OpTask*>& tasks, std::vector<absl::Status>* stopped);

// The h2d / kernel / d2h stages of the launch RunOnBackend just ran on this thread.
void RecordLaunchStages(Metrics& metrics);

// While alive, LaunchAnswersShareOneGroup() on this thread says whether
// `tasks` (one launch's, about to be answered) share one answer_group.
class AnswerGroupScope {
 public:
  explicit AnswerGroupScope(const std::vector<OpTask*>& tasks);
  ~AnswerGroupScope();
  AnswerGroupScope(const AnswerGroupScope&) = delete;
  AnswerGroupScope& operator=(const AnswerGroupScope&) = delete;
};

}  // namespace fusedserve
