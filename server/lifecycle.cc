#include "server/lifecycle.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "telemetry/log.h"

namespace fusedserve {
namespace {

const char* SignalName(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal"; }

[[noreturn]] void ExitNow(int sig, const char* phase) {
  LogError(absl::StrCat("received ", SignalName(sig), " during ", phase, "; exiting now"));
  std::fflush(nullptr);
  std::_Exit(128 + sig);
}

}  // namespace

Lifecycle& Lifecycle::Start() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // Never destroyed: the watcher runs until the process exits.
  static Lifecycle* lifecycle = new Lifecycle;
  std::thread([] { lifecycle->Watch(); }).detach();
  return *lifecycle;
}

void Lifecycle::Watch() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    absl::MutexLock lock(&mu_);
    switch (phase_) {
      case Phase::kStarting:
        ExitNow(sig, "start-up");
      case Phase::kDraining:
        ExitNow(sig, "the drain");
      case Phase::kServing:
        if (signal_ != 0) ExitNow(sig, "the drain");  // second signal before the drain began
        signal_ = sig;
        break;
    }
  }
}

void Lifecycle::EnterServing(const std::function<void()>& report_serving) {
  // Under the lock: a signal waits for SERVING to be reported and then
  // drains, or wins and exits before it is.
  absl::MutexLock lock(&mu_);
  phase_ = Phase::kServing;
  report_serving();
}

int Lifecycle::WaitForShutdown() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* s) { return *s != 0; }, &signal_));
  phase_ = Phase::kDraining;
  LogInfo(absl::StrCat("received ", SignalName(signal_), "; draining"));
  return signal_;
}

}  // namespace fusedserve
