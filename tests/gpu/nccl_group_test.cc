// NcclGroup (kernels/cuda/nccl_group.h): the all-reduce the tensor-parallel
// runner uses, over every visible GPU (one on a single-GPU host: the N = 1
// path through NCCL) and over one GPU, eager and captured in CUDA graphs,
// against the host's sum; the same in NCCL symmetric windows, the
// all-gather of the vocabulary-parallel LM head, and the ranks' fused
// all-reduce + residual add + RMS norm (tp_add_norm.h). Skips without a GPU
// or without NCCL.
#include "kernels/cuda/nccl_group.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/tp_add_norm.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// GPUs 0 .. n-1 (a group over the first n).
std::vector<int> FirstGpus(int n) {
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  return devices;
}

// fn(k) for every rank k of n at once, each on its own thread (NCCL's
// collective set-up calls: one thread per rank, as the runner's loaders).
void OnRankThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k) threads.emplace_back(fn, k);
  for (std::thread& t : threads) t.join();
}

// Per-rank device buffers and streams of one group.
struct Ranks {
  std::vector<void*> data;
  std::vector<cudaStream_t> streams;
  bool owns_data = true;  // false: the group's symmetric windows
  ~Ranks() {
    if (owns_data)
      for (void* p : data) cudaFree(p);
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
};

float ToHost(DType t, const void* p, size_t i) {
  if (t == DType::kF32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return t == DType::kBF16 ? Bf16ToFloat(b) : HalfToFloat(b);
}

void FromHost(DType t, float v, void* p, size_t i) {
  if (t == DType::kF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = t == DType::kBF16 ? FloatToBf16(v) : FloatToHalf(v);
  }
}

// Fresh random inputs on every rank; returns the host sum in fp64 per element.
std::vector<double> FillRanks(const cuda::NcclGroup& g, Ranks& r, DType t, size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<double> sum(count, 0.0);
  std::vector<uint8_t> host(count * DTypeSize(t));
  for (int k = 0; k < g.size(); ++k) {
    for (size_t i = 0; i < count; ++i) {
      FromHost(t, u(rng), host.data(), i);
      sum[i] += ToHost(t, host.data(), i);
    }
    EXPECT_EQ(cudaSetDevice(g.device(k)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(r.data[k], host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return sum;
}

// Every rank must hold the sum, within the dtype's rounding of the result.
void ExpectSums(const cuda::NcclGroup& g, Ranks& r, DType t, const std::vector<double>& sum, const char* what) {
  std::vector<uint8_t> host(sum.size() * DTypeSize(t));
  for (int k = 0; k < g.size(); ++k) {
    ASSERT_EQ(cudaSetDevice(g.device(k)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), r.data[k], host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    double err = 0, ref = 0;
    for (size_t i = 0; i < sum.size(); ++i) {
      const double d = ToHost(t, host.data(), i) - sum[i];
      err += d * d;
      ref += sum[i] * sum[i];
    }
    const double rel = std::sqrt(err / ref);
    const double tol = t == DType::kF32 ? 1e-6 : 1e-2;
    EXPECT_LT(rel, tol) << what << " rank " << k << " dtype " << DTypeName(t);
  }
}

// Eager, from one thread (the ranks' calls between GroupStart/GroupEnd),
// then captured in one graph per rank (as the decode graphs do) and replayed
// twice on fresh inputs: every rank holds the sum each time.
void ExpectAllReduces(const cuda::NcclGroup& g, Ranks& r, DType t, size_t count, std::mt19937& rng,
                      const std::string& where) {
  std::vector<double> sum = FillRanks(g, r, t, count, rng);
  ASSERT_TRUE(g.GroupStart().ok());
  for (int k = 0; k < g.size(); ++k) ASSERT_TRUE(g.AllReduceSum(k, r.data[k], count, t, r.streams[k]).ok());
  ASSERT_TRUE(g.GroupEnd().ok());
  for (int k = 0; k < g.size(); ++k) ASSERT_EQ(cudaStreamSynchronize(r.streams[k]), cudaSuccess);
  ExpectSums(g, r, t, sum, (where + "eager").c_str());

  std::vector<cudaGraphExec_t> execs(g.size(), nullptr);
  ASSERT_TRUE(g.GroupStart().ok());
  for (int k = 0; k < g.size(); ++k) {
    ASSERT_EQ(cudaSetDevice(g.device(k)), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(r.streams[k], cudaStreamCaptureModeRelaxed), cudaSuccess);
    ASSERT_TRUE(g.AllReduceSum(k, r.data[k], count, t, r.streams[k]).ok());
  }
  ASSERT_TRUE(g.GroupEnd().ok());
  for (int k = 0; k < g.size(); ++k) {
    ASSERT_EQ(cudaSetDevice(g.device(k)), cudaSuccess);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(r.streams[k], &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&execs[k], graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
  }
  for (int replay = 0; replay < 2; ++replay) {
    sum = FillRanks(g, r, t, count, rng);
    for (int k = 0; k < g.size(); ++k) {
      ASSERT_EQ(cudaSetDevice(g.device(k)), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(execs[k], r.streams[k]), cudaSuccess);
    }
    for (int k = 0; k < g.size(); ++k) ASSERT_EQ(cudaStreamSynchronize(r.streams[k]), cudaSuccess);
    ExpectSums(g, r, t, sum, (where + "graph replay").c_str());
  }
  for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
}

void RunGroup(const std::vector<int>& devices) {
  std::unique_ptr<cuda::NcclGroup> g;
  std::string why;
  if (!cuda::NcclAvailable(&why)) GTEST_SKIP() << why;
  const CudaStatus created = cuda::NcclGroup::Create(devices, &g);
  ASSERT_TRUE(created.ok()) << created.message;
  std::printf("NCCL %s, %d rank(s)\n", g->version().c_str(), g->size());
  std::mt19937 rng(static_cast<unsigned>(devices.size()) * 7919u + 1u);
  // A decode step's all-reduce (B=1 x 2048 bf16 = 4 KB) up to a prefill's.
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (size_t count : {size_t{1}, size_t{2048}, size_t{2048 * 64 + 3}, size_t{4096 * 2048}}) {
      Ranks r;
      for (int k = 0; k < g->size(); ++k) {
        ASSERT_EQ(cudaSetDevice(g->device(k)), cudaSuccess);
        void* p = nullptr;
        ASSERT_EQ(cudaMalloc(&p, count * DTypeSize(t)), cudaSuccess);
        r.data.push_back(p);
        cudaStream_t s = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        r.streams.push_back(s);
      }
      ASSERT_NO_FATAL_FAILURE(ExpectAllReduces(*g, r, t, count, rng, ""));
    }
  }
}

// The group over every visible GPU, or in *skip why this host cannot have
// one (no GPU, no NCCL library), in which case nothing is created.
CudaStatus GroupOverEveryGpu(std::unique_ptr<cuda::NcclGroup>* g, std::string* skip) {
  const int n = GpuCount();
  if (n < 1) {
    *skip = "no CUDA device";
    return CudaStatus::Ok();
  }
  skip->clear();
  if (!cuda::NcclAvailable(skip)) {
    if (skip->empty()) *skip = "NCCL is not available";
    return CudaStatus::Ok();
  }
  return cuda::NcclGroup::Create(FirstGpus(n), g);
}

TEST(NcclGroupTest, AllReduceOverOneGpu) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device";
  RunGroup({0});
}

TEST(NcclGroupTest, AllReduceOverEveryGpu) {
  const int n = GpuCount();
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs (" << n << " visible)";
  RunGroup(FirstGpus(n));
}

// Symmetric windows (registered from one thread per rank, as the runner's
// loaders do) hold all-reduces like plain buffers, eager and in graphs; an
// all-gather puts rank r's elements at r x count on every rank, bit for bit.
TEST(NcclGroupTest, SymmetricWindowsAndAllGatherOverEveryGpu) {
  std::unique_ptr<cuda::NcclGroup> g;
  std::string skip;
  const CudaStatus created = GroupOverEveryGpu(&g, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_TRUE(created.ok()) << created.message;
  const int n = g->size();
  const size_t kBytes = size_t{4} << 20;
  std::vector<void*> windows(n, nullptr);
  std::vector<std::string> errors(n);
  OnRankThreads(n, [&](int k) {
    if (CudaStatus s = g->AllocateSymmetric(k, kBytes, &windows[k]); !s.ok()) errors[k] = s.message;
  });
  if (!errors[0].empty()) GTEST_SKIP() << errors[0];
  for (int k = 1; k < n; ++k) ASSERT_TRUE(errors[k].empty()) << errors[k];
  std::mt19937 rng(42);
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (size_t count : {size_t{1}, size_t{4096}, size_t{4096 * 16 + 5}}) {
      Ranks r;
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        cudaStream_t s = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
        r.streams.push_back(s);
      }
      r.data = windows;
      r.owns_data = false;
      ASSERT_NO_FATAL_FAILURE(ExpectAllReduces(*g, r, t, count, rng, "symmetric "));

      // All-gather: send from each window, receive into plain buffers.
      const size_t es = DTypeSize(t);
      std::vector<std::vector<uint8_t>> sent(n, std::vector<uint8_t>(count * es));
      std::vector<void*> recv(n, nullptr);
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < count; ++i) FromHost(t, static_cast<float>(k * 1000 + i % 977) / 8, sent[k].data(), i);
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(r.data[k], sent[k].data(), count * es, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&recv[k], n * count * es), cudaSuccess);
        ASSERT_EQ(cudaMemset(recv[k], 0xff, n * count * es), cudaSuccess);  // poison
      }
      ASSERT_TRUE(g->GroupStart().ok());
      for (int k = 0; k < n; ++k) ASSERT_TRUE(g->AllGather(k, r.data[k], recv[k], count, t, r.streams[k]).ok());
      ASSERT_TRUE(g->GroupEnd().ok());
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(r.streams[k]), cudaSuccess);
        std::vector<uint8_t> got(n * count * es);
        ASSERT_EQ(cudaMemcpy(got.data(), recv[k], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        for (int from = 0; from < n; ++from) {
          EXPECT_EQ(0, std::memcmp(got.data() + from * count * es, sent[from].data(), count * es))
              << "rank " << k << " part " << from << " dtype " << DTypeName(t) << " count " << count;
        }
        cudaFree(recv[k]);
      }
    }
  }
}

// The fused all-reduce + residual add + RMS norm of the ranks (TpAddNorm):
// fresh random partial sums on every rank in both buffers in turn (as o_proj
// and down alternate), a replicated residual and weight, poisoned outputs;
// every rank's residual_out and y match the host's reference (fp64 sum
// rounded to the dtype, its RMS norm times the weight) and are the same bits
// on every rank. Eager launches from one thread, then one graph per rank
// replayed on fresh inputs.
TEST(NcclGroupTest, FusedAllReduceAddNormOverEveryGpu) {
  std::unique_ptr<cuda::NcclGroup> g;
  std::string skip;
  const CudaStatus created = GroupOverEveryGpu(&g, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_TRUE(created.ok()) << created.message;
  const int n = g->size();
  constexpr int64_t kMaxRows = 1024;  // a prefill's rows loop over a grid of resident blocks
  const float eps = 1e-5f;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto [t, hidden] : {std::pair{DType::kBF16, int64_t{4096}}, std::pair{DType::kF32, int64_t{96}},
                           std::pair{DType::kF16, int64_t{2056}}}) {
    std::vector<std::unique_ptr<cuda::TpAddNorm>> fused(n);
    std::vector<std::string> errors(n);
    OnRankThreads(n, [&](int k) {
      cudaSetDevice(k);
      if (CudaStatus s = cuda::TpAddNorm::Create(*g, k, kMaxRows, hidden, t, &fused[k]); !s.ok()) errors[k] = s.message;
    });
    if (!errors[0].empty()) GTEST_SKIP() << "fused all-reduce + norm unavailable: " << errors[0];
    for (int k = 1; k < n; ++k) ASSERT_TRUE(errors[k].empty()) << errors[k];
    std::printf("fused all-reduce + norm over %d GPU(s), %s hidden %lld\n", n, DTypeName(t),
                static_cast<long long>(hidden));
    const size_t es = DTypeSize(t);
    const size_t cap = kMaxRows * hidden * es;
    Ranks r;  // per rank: residual, weight, y, residual_out
    for (int k = 0; k < n; ++k) {
      ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
      void* p = nullptr;
      ASSERT_EQ(cudaMalloc(&p, 4 * cap), cudaSuccess);
      r.data.push_back(p);
      cudaStream_t s = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      r.streams.push_back(s);
    }
    auto at = [&](int k, int slot) { return static_cast<uint8_t*>(r.data[k]) + slot * cap; };
    // Fills the inputs of `rows` rows in buffer `which`; returns the expected
    // residual_out and y.
    auto fill = [&](int which, int64_t rows, std::vector<float>* want_res, std::vector<float>* want_y) {
      const size_t count = rows * hidden;
      std::vector<double> sum(count, 0.0);
      std::vector<uint8_t> host(count * es), residual(count * es), weight(hidden * es), poison(2 * cap, 0xff);
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < count; ++i) {
          FromHost(t, u(rng), host.data(), i);
          sum[i] += ToHost(t, host.data(), i);
        }
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(fused[k]->partial_sums(which, rows), host.data(), host.size(), cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
      for (size_t i = 0; i < count; ++i) FromHost(t, 2 * u(rng), residual.data(), i);
      for (int64_t i = 0; i < hidden; ++i) FromHost(t, 1 + u(rng) / 2, weight.data(), i);
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(at(k, 0), residual.data(), count * es, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(at(k, 1), weight.data(), hidden * es, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(at(k, 2), poison.data(), 2 * cap, cudaMemcpyHostToDevice), cudaSuccess);
      }
      want_res->assign(count, 0.0f);
      want_y->assign(count, 0.0f);
      std::vector<uint8_t> rounded(es);
      for (int64_t row = 0; row < rows; ++row) {
        double sq = 0;
        for (int64_t i = 0; i < hidden; ++i) {
          const size_t e = row * hidden + i;
          FromHost(t, static_cast<float>(sum[e] + ToHost(t, residual.data(), e)), rounded.data(), 0);
          const double v = ToHost(t, rounded.data(), 0);
          (*want_res)[e] = static_cast<float>(v);
          sq += v * v;
        }
        const double inv = 1.0 / std::sqrt(sq / hidden + eps);
        for (int64_t i = 0; i < hidden; ++i) {
          const size_t e = row * hidden + i;
          (*want_y)[e] = static_cast<float>((*want_res)[e] * inv * ToHost(t, weight.data(), i));
        }
      }
    };
    auto launch = [&](int k, int which, int64_t rows) {
      return fused[k]->Launch(which, rows, at(k, 0), at(k, 1), eps, at(k, 2), at(k, 3), r.streams[k]);
    };
    auto expect = [&](int64_t rows, const std::vector<float>& want_res, const std::vector<float>& want_y,
                      const std::string& what) {
      const size_t count = rows * hidden;
      std::vector<uint8_t> first_y, first_res;
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(r.streams[k]), cudaSuccess);
        std::vector<uint8_t> y(count * es), res(count * es);
        ASSERT_EQ(cudaMemcpy(y.data(), at(k, 2), y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(res.data(), at(k, 3), res.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        std::vector<float> got_y(count), got_res(count);
        for (size_t i = 0; i < count; ++i) {
          got_y[i] = ToHost(t, y.data(), i);
          got_res[i] = ToHost(t, res.data(), i);
        }
        const double tol = t == DType::kF32 ? 1e-5 : 1e-2;
        EXPECT_LT(RelErrorNorm(got_res, want_res), tol) << what << " residual_out rank " << k;
        EXPECT_LT(RelErrorNorm(got_y, want_y), tol) << what << " y rank " << k;
        if (k == 0) {
          first_y = y;
          first_res = res;
        } else {
          EXPECT_TRUE(y == first_y && res == first_res) << what << ": rank " << k << " differs from rank 0";
        }
      }
    };
    std::vector<float> want_res, want_y;
    int which = 0;
    for (int64_t rows : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{1000}, int64_t{2}}) {
      ASSERT_NO_FATAL_FAILURE(fill(which, rows, &want_res, &want_y));
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        const CudaStatus s = launch(k, which, rows);
        ASSERT_TRUE(s.ok()) << s.message;
      }
      ASSERT_NO_FATAL_FAILURE(
          expect(rows, want_res, want_y, std::string(DTypeName(t)) + " eager rows " + std::to_string(rows)));
      which = 1 - which;
    }
    // A graph per rank and buffer, replayed in turn on fresh inputs.
    const int64_t rows = 4;
    std::vector<cudaGraphExec_t> execs(2 * n, nullptr);  // [buffer][rank]
    for (int b = 0; b < 2; ++b) {
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        ASSERT_EQ(cudaStreamBeginCapture(r.streams[k], cudaStreamCaptureModeRelaxed), cudaSuccess);
        const CudaStatus s = launch(k, b, rows);
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamEndCapture(r.streams[k], &graph), cudaSuccess);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(cudaGraphInstantiate(&execs[b * n + k], graph, 0), cudaSuccess);
        cudaGraphDestroy(graph);
      }
    }
    for (int replay = 0; replay < 4; ++replay) {
      const int b = replay % 2;
      ASSERT_NO_FATAL_FAILURE(fill(b, rows, &want_res, &want_y));
      for (int k = 0; k < n; ++k) {
        ASSERT_EQ(cudaSetDevice(k), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(execs[b * n + k], r.streams[k]), cudaSuccess);
      }
      ASSERT_NO_FATAL_FAILURE(
          expect(rows, want_res, want_y, std::string(DTypeName(t)) + " graph replay " + std::to_string(replay)));
    }
    for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  }
}

TEST(NcclGroupTest, BadGroupsAreRefusedClearly) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device";
  std::string why;
  if (!cuda::NcclAvailable(&why)) GTEST_SKIP() << why;
  std::unique_ptr<cuda::NcclGroup> g;
  CudaStatus s = cuda::NcclGroup::Create({0, 0}, &g);
  EXPECT_NE(s.message.find("distinct"), std::string::npos) << s.message;
  s = cuda::NcclGroup::Create({0, GpuCount()}, &g);
  EXPECT_NE(s.message.find("visible"), std::string::npos) << s.message;
  s = cuda::NcclGroup::Create({}, &g);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(g, nullptr);
}

}  // namespace
}  // namespace fusedserve
