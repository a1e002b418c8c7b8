// Test support: runs a body in a forked child and returns its exit code, so
// that code which blocks (a FIFO opened for reading) or exhausts memory fails
// its test instead of hanging the runner or taking the machine down. The body
// reports failures by its return value (gtest assertions do not cross fork).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

namespace fusedserve::testing {

// The child's exit code (99: the body threw, e.g. std::bad_alloc); -1 when
// it was killed by a signal (an abort, a resource limit) or had not finished
// after timeout_s (it is then killed).
inline int RunInChild(const std::function<int()>& body, double timeout_s) {
  const pid_t pid = fork();
  if (pid == 0) {
    // The exception must not reach gtest in the child, which would go on
    // running the remaining tests there.
    int code = 99;
    try {
      code = body();
    } catch (...) {
    }
    _exit(code);
  }
  if (pid < 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace fusedserve::testing
