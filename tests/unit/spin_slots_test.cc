// SpinSlots: at most N holders at once, under contention too, and a
// released slot is free again.
#include "server/spin_slots.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace fusedserve {
namespace {

TEST(SpinSlots, AtMostTheirNumberAreHeld) {
  SpinSlots slots(2);
  EXPECT_TRUE(slots.TryAcquire());
  EXPECT_TRUE(slots.TryAcquire());
  EXPECT_FALSE(slots.TryAcquire());
  slots.Release();
  EXPECT_TRUE(slots.TryAcquire());
  EXPECT_FALSE(slots.TryAcquire());
}

TEST(SpinSlots, NoSlotsNeverSpin) { EXPECT_FALSE(SpinSlots(0).TryAcquire()); }

TEST(SpinSlots, ContendedHoldersNeverExceedTheBound) {
  constexpr int kSlots = 3, kThreads = 8, kRounds = 20000;
  SpinSlots slots(kSlots);
  std::atomic<int> holders{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        if (!slots.TryAcquire()) continue;
        const int now = holders.fetch_add(1) + 1;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        holders.fetch_sub(1);
        slots.Release();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), kSlots);
  EXPECT_GE(most.load(), 1);
  // Every slot came back.
  for (int i = 0; i < kSlots; ++i) EXPECT_TRUE(slots.TryAcquire());
  EXPECT_FALSE(slots.TryAcquire());
}

}  // namespace
}  // namespace fusedserve
