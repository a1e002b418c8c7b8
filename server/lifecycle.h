// The process's answer to SIGTERM/SIGINT in every phase. Start() runs first
// in main: the signals are blocked in every thread and one watcher thread
// waits for them, so a signal is never lost or deferred:
//   start-up (config, model, warm-up; a hung volume included): log and exit
//     at once with 128 + signal, before anything reports SERVING;
//   serving: wake WaitForShutdown, which starts the drain;
//   draining: a second signal exits at once (an operator's hard stop).
#pragma once

#include <functional>

#include "absl/synchronization/mutex.h"

namespace fusedserve {

class Lifecycle {
 public:
  // Blocks SIGTERM/SIGINT and starts the watcher. Call once, before any
  // other thread exists.
  static Lifecycle& Start();

  // Start-up is complete: runs report_serving (which reports SERVING) and
  // enters the serving phase, unless a signal came first, in which case the
  // process is already exiting and this never returns.
  void EnterServing(const std::function<void()>& report_serving);

  // Blocks until a shutdown signal arrives while serving; returns it. The
  // phase is then draining.
  int WaitForShutdown();

 private:
  enum class Phase { kStarting, kServing, kDraining };
  Lifecycle() = default;
  void Watch();

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kStarting;
  int signal_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fusedserve
