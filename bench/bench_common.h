// What the GPU benchmarks share: a checked CUDA call that ends the run, the
// median, and the copy-bandwidth ceiling every table is measured against.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define BENCH_CHECK(expr)                                                                                    \
  do {                                                                                                       \
    cudaError_t err_ = (expr);                                                                               \
    if (err_ != cudaSuccess) {                                                                               \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #expr, __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                          \
    }                                                                                                        \
  } while (0)

namespace fusedserve::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// GPU time in us of the stream work `issue` enqueues on `stream`, between two events.
template <typename Issue>
double EventUs(cudaStream_t stream, Issue&& issue) {
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  BENCH_CHECK(cudaEventRecord(e0, stream));
  issue();
  BENCH_CHECK(cudaEventRecord(e1, stream));
  BENCH_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e3;
}

// Host-clock round trips: p50 / p99 / min microseconds of fn(i) over
// `iters` calls, after `warmup` untimed ones (i counts all calls).
struct HostLatencyUs {
  double p50, p99, min;
};
template <typename Fn>
HostLatencyUs TimeHostUs(int iters, int warmup, Fn&& fn) {
  std::vector<double> us;
  for (int i = 0; i < iters + warmup; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(i);
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= warmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100], us[0]};
}

// Median time per call of a graph of `calls` calls, over `reps` replays
// after two untimed ones.
inline double GraphReplayUs(cudaStream_t stream, cudaGraphExec_t exec, int calls, int reps) {
  std::vector<double> us;
  for (int rep = 0; rep < reps + 2; ++rep) {
    const double t = EventUs(stream, [&] { BENCH_CHECK(cudaGraphLaunch(exec, stream)); });
    if (rep >= 2) us.push_back(t / calls);
  }
  return Median(us);
}

// Device-to-device copy of 1 GiB, GB/s counting bytes read and written
// (docs/peers.md's ceiling): median of 10 after 3 warm-up copies.
inline double CopyBandwidthGBs(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  BENCH_CHECK(cudaMalloc(&a, bytes));
  BENCH_CHECK(cudaMalloc(&b, bytes));
  BENCH_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int i = 0; i < 13; ++i) {
    BENCH_CHECK(cudaEventRecord(e0, stream));
    BENCH_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CHECK(cudaEventRecord(e1, stream));
    BENCH_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (Median(ms) * 1e-3) / 1e9;
}

}  // namespace fusedserve::bench
