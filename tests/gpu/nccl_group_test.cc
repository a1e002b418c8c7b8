// NcclGroup (kernels/cuda/nccl_group.h): the all-reduce the tensor-parallel
// runner uses, over every visible GPU (one on a single-GPU host: the N = 1
// path through NCCL) and over one GPU, eager and captured in CUDA graphs,
// against the host's sum; the same in NCCL symmetric windows, and the
// all-gather of the vocabulary-parallel LM head. Skips without a GPU or
// without NCCL.
#include "kernels/cuda/nccl_group.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace fusedserve {
namespace {

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
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

TEST(NcclGroupTest, AllReduceOverOneGpu) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA device";
  RunGroup({0});
}

TEST(NcclGroupTest, AllReduceOverEveryGpu) {
  const int n = GpuCount();
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs (" << n << " visible)";
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  RunGroup(devices);
}

// Symmetric windows (registered from one thread per rank, as the runner's
// loaders do) hold all-reduces like plain buffers, eager and in graphs; an
// all-gather puts rank r's elements at r x count on every rank, bit for bit.
TEST(NcclGroupTest, SymmetricWindowsAndAllGatherOverEveryGpu) {
  const int n = GpuCount();
  if (n < 1) GTEST_SKIP() << "no CUDA device";
  std::string why;
  if (!cuda::NcclAvailable(&why)) GTEST_SKIP() << why;
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  std::unique_ptr<cuda::NcclGroup> g;
  const CudaStatus created = cuda::NcclGroup::Create(devices, &g);
  ASSERT_TRUE(created.ok()) << created.message;
  const size_t kBytes = size_t{4} << 20;
  std::vector<void*> windows(n, nullptr);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k) {
    threads.emplace_back([&, k] {
      if (CudaStatus s = g->AllocateSymmetric(k, kBytes, &windows[k]); !s.ok()) errors[k] = s.message;
    });
  }
  for (std::thread& t : threads) t.join();
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
