// How many polling threads may spin at once (server/async_calls.h's
// PollCompletionQueue, and the gRPC floor's echo server). Under load every
// queue has events, and with no bound every polling thread keeps its core
// busy between them: CPU that a client on the same host and the scheduler's
// workers want. A few spinning threads keep a steady client's latency; the
// rest block, and under load their next event is near anyway.
#pragma once

#include <atomic>

namespace fusedserve {

class SpinSlots {
 public:
  explicit SpinSlots(int slots) : free_(slots) {}
  bool TryAcquire() {
    int free = free_.load(std::memory_order_relaxed);
    while (free > 0) {
      if (free_.compare_exchange_weak(free, free - 1, std::memory_order_acquire)) return true;
    }
    return false;
  }
  void Release() { free_.fetch_add(1, std::memory_order_release); }

 private:
  std::atomic<int> free_;
};

}  // namespace fusedserve
