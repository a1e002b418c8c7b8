// NCCL all-reduce over the visible GPUs (or FS_TP_SIZE of them), bf16 in
// place, as the tensor-parallel runner issues it after o_proj and down_proj:
// decode messages are a few KB (B x hidden x 2 bytes), prefill ones MB.
// Each size is timed as a CUDA graph of 20 back-to-back all-reduces per rank
// (how the decode graphs replay them), median of 15 replays; reported per
// all-reduce: µs, and bus bandwidth 2(N-1)/N x bytes / time (NCCL's busbw;
// 0 for one rank), in plain cudaMalloc buffers and in NCCL symmetric windows
// (ncclMemAlloc + ncclCommWindowRegister). A second table times what a
// rank runs after o_proj / down in a decode step (hidden 4096 bf16, 1-64
// rows) and a prefill (512, 4096 rows): the all-reduce then the add_rms_norm kernel, against the fused
// all-reduce + add + norm kernel (tp_add_norm.h). Usage: gpu_collective_bench
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.h"
#include "kernels/cuda/nccl_group.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/tp_add_norm.h"

using fusedserve::DType;
using fusedserve::bench::Median;

// Per-iteration µs of enqueue(k, i) (rank k's work of iteration i): a graph
// of kInGraph iterations per rank (each between GroupStart and GroupEnd, as
// one thread issues NCCL calls for several ranks), median of 15 replays.
template <typename Enqueue>
double GraphUs(const fusedserve::cuda::NcclGroup& g, const std::vector<cudaStream_t>& streams, Enqueue enqueue) {
  const int n = g.size(), kInGraph = 20;
  std::vector<cudaGraphExec_t> execs(n);
  for (int k = 0; k < n; ++k) {
    BENCH_CHECK(cudaSetDevice(k));
    BENCH_CHECK(cudaStreamBeginCapture(streams[k], cudaStreamCaptureModeRelaxed));
  }
  for (int i = 0; i < kInGraph; ++i) {
    if (!g.GroupStart().ok()) std::exit(1);
    for (int k = 0; k < n; ++k) {
      BENCH_CHECK(cudaSetDevice(k));
      if (fusedserve::CudaStatus s = enqueue(k, i); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.message.c_str());
        std::exit(1);
      }
    }
    if (!g.GroupEnd().ok()) std::exit(1);
  }
  for (int k = 0; k < n; ++k) {
    BENCH_CHECK(cudaSetDevice(k));
    cudaGraph_t graph = nullptr;
    BENCH_CHECK(cudaStreamEndCapture(streams[k], &graph));
    BENCH_CHECK(cudaGraphInstantiate(&execs[k], graph, 0));
    BENCH_CHECK(cudaGraphDestroy(graph));
  }
  std::vector<double> us;
  cudaEvent_t e0, e1;
  BENCH_CHECK(cudaSetDevice(0));
  BENCH_CHECK(cudaEventCreate(&e0));
  BENCH_CHECK(cudaEventCreate(&e1));
  for (int rep = 0; rep < 18; ++rep) {
    BENCH_CHECK(cudaSetDevice(0));
    BENCH_CHECK(cudaEventRecord(e0, streams[0]));
    for (int k = 0; k < n; ++k) {
      BENCH_CHECK(cudaSetDevice(k));
      BENCH_CHECK(cudaGraphLaunch(execs[k], streams[k]));
    }
    BENCH_CHECK(cudaSetDevice(0));
    BENCH_CHECK(cudaEventRecord(e1, streams[0]));
    for (int k = 0; k < n; ++k) BENCH_CHECK(cudaStreamSynchronize(streams[k]));
    float ms = 0;
    BENCH_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (rep >= 3) us.push_back(ms * 1e3 / kInGraph);
  }
  for (int k = 0; k < n; ++k) BENCH_CHECK(cudaGraphExecDestroy(execs[k]));
  BENCH_CHECK(cudaEventDestroy(e0));
  BENCH_CHECK(cudaEventDestroy(e1));
  return Median(us);
}

// fn(k) for every rank k of n at once, each on its own thread (NCCL's
// collective set-up calls: one thread per rank, as the runner's loaders).
void OnRankThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k) threads.emplace_back(fn, k);
  for (std::thread& t : threads) t.join();
}

// Per all-reduce µs of `count` bf16 in place in bufs (one per rank).
double AllReduceUs(const fusedserve::cuda::NcclGroup& g, const std::vector<void*>& bufs,
                   const std::vector<cudaStream_t>& streams, size_t count) {
  return GraphUs(g, streams, [&](int k, int) { return g.AllReduceSum(k, bufs[k], count, DType::kBF16, streams[k]); });
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  if (const char* e = std::getenv("FS_TP_SIZE")) n = std::min(n, std::atoi(e));
  std::string why;
  if (n < 1 || !fusedserve::cuda::NcclAvailable(&why)) {
    std::printf("skipped: %s\n", n < 1 ? "no CUDA device" : why.c_str());
    return 0;
  }
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  std::unique_ptr<fusedserve::cuda::NcclGroup> g;
  if (fusedserve::CudaStatus s = fusedserve::cuda::NcclGroup::Create(devices, &g); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.message.c_str());
    return 1;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("NCCL %s, %d x %s\n", g->version().c_str(), n, prop.name);
  const size_t kMax = size_t{64} << 20;
  std::vector<void*> plain(n), symmetric(n);
  std::vector<cudaStream_t> streams(n);
  for (int k = 0; k < n; ++k) {
    BENCH_CHECK(cudaSetDevice(k));
    BENCH_CHECK(cudaMalloc(&plain[k], kMax));
    BENCH_CHECK(cudaMemset(plain[k], 0x3c, kMax));  // bf16 ~0.0115: sums stay finite
    BENCH_CHECK(cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking));
  }
  // The same all-reduces inside NCCL symmetric windows (the runner's decode
  // buffers where the library has them).
  // Registration is collective: one thread per rank, as the runner's ranks.
  std::vector<std::string> errors(n);
  OnRankThreads(n, [&](int k) {
    if (fusedserve::CudaStatus s = g->AllocateSymmetric(k, kMax, &symmetric[k]); !s.ok()) errors[k] = s.message;
  });
  std::string no_symmetric;
  for (const std::string& e : errors) {
    if (no_symmetric.empty()) no_symmetric = e;
  }
  if (no_symmetric.empty()) {
    for (int k = 0; k < n; ++k) {
      BENCH_CHECK(cudaSetDevice(k));
      BENCH_CHECK(cudaMemset(symmetric[k], 0x3c, kMax));
    }
  } else {
    std::printf("symmetric windows: %s\n", no_symmetric.c_str());
  }
  std::printf(
      "| bytes | per all-reduce (µs) | busbw (GB/s) | symmetric window (µs) | busbw (GB/s) |\n|---|---|---|---|---|\n");
  for (size_t bytes = 4096; bytes <= kMax; bytes *= 4) {
    const double t = AllReduceUs(*g, plain, streams, bytes / 2);
    const double ts = no_symmetric.empty() ? AllReduceUs(*g, symmetric, streams, bytes / 2) : 0.0;
    auto busbw = [&](double us) { return n > 1 && us > 0 ? 2.0 * (n - 1) / n * bytes / (us * 1e-6) / 1e9 : 0.0; };
    std::printf("| %zu | %.2f | %.1f | %.2f | %.1f |\n", bytes, t, busbw(t), ts, busbw(ts));
  }

  // All-reduce + residual add + RMS norm of a decode step's rows.
  constexpr int64_t kHidden = 4096, kMaxRows = 4096;
  const size_t row_bytes = kHidden * 2;
  std::vector<std::unique_ptr<fusedserve::cuda::TpAddNorm>> fused(n);
  OnRankThreads(n, [&](int k) {
    BENCH_CHECK(cudaSetDevice(k));
    if (fusedserve::CudaStatus s =
            fusedserve::cuda::TpAddNorm::Create(*g, k, kMaxRows, kHidden, DType::kBF16, &fused[k]);
        !s.ok())
      errors[k] = s.message;
  });
  const bool have_fused = fused[0] != nullptr;
  if (!have_fused) std::printf("fused all-reduce + norm: %s\n", errors[0].c_str());
  // Per rank: residual, weight, y, residual_out.
  std::vector<void*> norm_tensors(n);
  for (int k = 0; k < n; ++k) {
    BENCH_CHECK(cudaSetDevice(k));
    BENCH_CHECK(cudaMalloc(&norm_tensors[k], 4 * kMaxRows * row_bytes));
    BENCH_CHECK(cudaMemset(norm_tensors[k], 0x3c, 4 * kMaxRows * row_bytes));
  }
  auto tensor = [&](int k, int slot) { return static_cast<char*>(norm_tensors[k]) + slot * kMaxRows * row_bytes; };
  auto norm = [&](int k, const void* sums, int64_t rows) {
    fusedserve::cuda::NormParams p;
    p.kind = fusedserve::cuda::NormKind::kAddRms;
    p.dtype = DType::kBF16;
    p.x = sums;
    p.residual = tensor(k, 0);
    p.weight = tensor(k, 1);
    p.y = tensor(k, 2);
    p.residual_out = tensor(k, 3);
    p.rows = rows;
    p.hidden = kHidden;
    p.eps = 1e-5f;
    return fusedserve::cuda::LaunchNorm(p, fusedserve::cuda::NormConfig{}, streams[k]);
  };
  std::printf(
      "\n| rows (hidden 4096 bf16) | all-reduce + add_rms_norm (µs) | symmetric + add_rms_norm (µs) | fused "
      "(µs) |\n|---|---|---|---|\n");
  for (int64_t rows : {1, 4, 16, 64, 512, 4096}) {
    const size_t count = rows * kHidden;
    auto two_kernels = [&](const std::vector<void*>& bufs) {
      return GraphUs(*g, streams, [&](int k, int) -> fusedserve::CudaStatus {
        if (fusedserve::CudaStatus s = g->AllReduceSum(k, bufs[k], count, DType::kBF16, streams[k]); !s.ok()) return s;
        return norm(k, bufs[k], rows);
      });
    };
    const double plain_us = two_kernels(plain);
    const double sym_us = no_symmetric.empty() ? two_kernels(symmetric) : 0.0;
    double fused_us = 0.0;
    if (have_fused) {
      for (int k = 0; k < n; ++k) {
        BENCH_CHECK(cudaSetDevice(k));
        for (int b = 0; b < 2; ++b) BENCH_CHECK(cudaMemset(fused[k]->partial_sums(b, rows), 0x3c, count * 2));
      }
      fused_us = GraphUs(*g, streams, [&](int k, int i) {
        return fused[k]->Launch(i % 2, rows, tensor(k, 0), tensor(k, 1), 1e-5f, tensor(k, 2), tensor(k, 3), streams[k]);
      });
    }
    std::printf("| %lld | %.2f | %.2f | %.2f |\n", static_cast<long long>(rows), plain_us, sym_us, fused_us);
  }
  return 0;
}
