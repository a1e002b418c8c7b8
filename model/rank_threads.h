// RankThreads: runs one function for every rank of a tensor-parallel group
// at once, in lockstep (the CUDA runner's ranks, cuda_tensor_parallel.cc).
// Header-only and free of CUDA, so CI tests it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace fusedserve {

// Runs fn(rank) for ranks 0..n-1 at once: rank 0 on the calling thread, the
// others on threads kept for the purpose. One call at a time (the engine's).
// Ranks that all fail the same check fail together; when one fails and
// another is still running straggler_wait later, that one is taken to wait in
// a collective the failed rank never joins: release() (an NCCL abort) runs to
// free it, and aborted() says so from then on.
class RankThreads {
 public:
  static constexpr std::chrono::milliseconds kStragglerWait{10000};

  RankThreads(int ranks, std::chrono::milliseconds straggler_wait, std::function<void()> release)
      : straggler_wait_(straggler_wait), release_(std::move(release)), results_(ranks) {
    for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  bool aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }

  // The first rank's error, in rank order.
  absl::Status Run(const std::function<absl::Status(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      pending_ = static_cast<int>(results_.size());
      watching_ = false;
      ++generation_;
    }
    start_.notify_all();
    Finish(0, fn(0));
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [&] { return pending_ == 0; });
      fn_ = nullptr;
    }
    for (absl::Status& s : results_) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  void Loop(int rank) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<absl::Status(int)>* fn = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
      }
      Finish(rank, (*fn)(rank));
    }
  }

  // Records a rank's result; the first rank to fail watches for stragglers.
  void Finish(int rank, absl::Status s) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool watch = !s.ok() && !watching_;
    watching_ = watching_ || watch;
    results_[rank] = std::move(s);
    --pending_;
    done_.notify_all();
    if (!watch) return;
    const uint64_t gen = generation_;
    if (!done_.wait_for(lock, straggler_wait_, [&] { return pending_ == 0 || generation_ != gen; })) {
      aborted_ = true;
      lock.unlock();
      if (release_) release_();
    }
  }

  const std::chrono::milliseconds straggler_wait_;
  const std::function<void()> release_;
  mutable std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<absl::Status(int)>* fn_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool watching_ = false;
  bool stop_ = false;
  bool aborted_ = false;
  std::vector<absl::Status> results_;
  std::vector<std::thread> threads_;
};

}  // namespace fusedserve
