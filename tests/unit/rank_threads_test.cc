// RankThreads (model/rank_threads.h), the lockstep driver of the
// tensor-parallel CUDA ranks: every rank runs each call at once, on its own
// thread; errors come back in rank order; ranks failing together release
// nothing; a rank left running after another failed (stuck in a collective
// on a GPU) is released once, and only after the straggler wait.
#include "model/rank_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

namespace fusedserve {
namespace {

using std::chrono::milliseconds;

TEST(RankThreadsTest, EveryRankRunsAtOnceOnItsOwnThread) {
  std::atomic<int> released{0};
  RankThreads t(4, milliseconds(2000), [&] { ++released; });
  for (int call = 0; call < 50; ++call) {
    std::atomic<int> arrived{0};
    std::mutex mu;
    std::set<std::thread::id> ids;
    absl::Status s = t.Run([&](int) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      // A barrier: passes only if all four run at the same time (as ranks
      // meeting in a collective must).
      ++arrived;
      while (arrived.load() < 4) std::this_thread::yield();
      return absl::OkStatus();
    });
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(ids.size(), 4u);
  }
  EXPECT_EQ(released.load(), 0);
  EXPECT_FALSE(t.aborted());
}

TEST(RankThreadsTest, RanksFailingTogetherReleaseNothing) {
  std::atomic<int> released{0};
  RankThreads t(3, milliseconds(2000), [&] { ++released; });
  absl::Status s = t.Run([](int r) { return absl::InvalidArgumentError("bad batch " + std::to_string(r)); });
  EXPECT_EQ(s.message(), "bad batch 0");  // rank order
  EXPECT_EQ(released.load(), 0);
  EXPECT_FALSE(t.aborted());
  EXPECT_TRUE(t.Run([](int) { return absl::OkStatus(); }).ok());  // still usable
}

TEST(RankThreadsTest, StragglerAfterAFailureIsReleased) {
  std::atomic<bool> stuck{true};
  std::atomic<int> released{0};
  RankThreads t(3, milliseconds(200), [&] {
    ++released;
    stuck = false;  // what ncclCommAbort does to a rank waiting in a collective
  });
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = t.Run([&](int r) -> absl::Status {
    if (r == 2) return absl::ResourceExhaustedError("rank 2: out of memory");
    while (stuck.load()) std::this_thread::sleep_for(milliseconds(1));
    return absl::InternalError("collective aborted");
  });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(released.load(), 1);
  EXPECT_TRUE(t.aborted());
  EXPECT_GE(waited, 0.19);
  EXPECT_EQ(s.message(), "collective aborted");  // rank 0's, in rank order
}

TEST(RankThreadsTest, SlowRanksWithoutFailureAreNotReleased) {
  std::atomic<int> released{0};
  RankThreads t(2, milliseconds(50), [&] { ++released; });
  absl::Status s = t.Run([](int r) {
    if (r == 1) std::this_thread::sleep_for(milliseconds(200));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(released.load(), 0);
}

}  // namespace
}  // namespace fusedserve
