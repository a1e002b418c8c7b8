// The device argmax (kernels/cuda/argmax.h), the CUDA model runner's greedy
// token, against the host's cpu::GreedyToken. Skips without a GPU.
#include "kernels/cuda/argmax.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace fusedserve {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The device argmax over a 128K vocabulary (several chunk CTAs per row,
// merged by the last one) against the host's cpu::GreedyToken: random rows, a
// tie across chunks, NaNs, an all-NaN row; replayed to check the chunk
// counters are left at zero.
TEST(DeviceArgmaxTest, MatchesHostGreedy) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 5, V = 128256;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<uint16_t> bits(rows * V);
  for (auto& b : bits) b = FloatToBf16(nd(rng));
  const float nan = std::nanf("");
  bits[1 * V + 100] = bits[1 * V + 120000] = FloatToBf16(50.0f);  // tie in different chunks: lower index wins
  bits[2 * V + 7] = FloatToBf16(nan);
  bits[2 * V + 90000] = FloatToBf16(40.0f);
  for (int64_t i = 0; i < V; ++i) bits[3 * V + i] = FloatToBf16(nan);
  bits[4 * V + V - 1] = FloatToBf16(60.0f);  // the very last element
  std::vector<float> host(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) host[i] = Bf16ToFloat(bits[i]);
  void *d_logits = nullptr, *d_ws = nullptr;
  int32_t* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_logits, bits.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, rows * sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_ws, cuda::ArgmaxWorkspaceBytes(rows)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_ws, 0, cuda::ArgmaxWorkspaceBytes(rows)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_logits, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  for (void* ws : {d_ws, d_ws, static_cast<void*>(nullptr)}) {                // twice with the workspace, once without
    ASSERT_EQ(cudaMemset(d_out, 0xff, rows * sizeof(int32_t)), cudaSuccess);  // poison
    ASSERT_TRUE(cuda::LaunchArgmaxRows(DType::kBF16, d_logits, rows, V, d_out, ws, nullptr).ok());
    std::vector<int32_t> got(rows);
    ASSERT_EQ(cudaMemcpy(got.data(), d_out, rows * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(got[r], cpu::GreedyToken(host.data() + r * V, V)) << "row " << r << (ws ? " (chunks)" : " (one CTA)");
    }
    EXPECT_EQ(got[1], 100);
    EXPECT_EQ(got[2], 90000);
    EXPECT_EQ(got[3], 0);
    EXPECT_EQ(got[4], V - 1);
  }
  cudaFree(d_logits);
  cudaFree(d_out);
  cudaFree(d_ws);
}

// Every float dtype, vocabularies of one element to past one chunk, odd
// sizes, rows with their maximum repeated: the lowest index wins.
TEST(DeviceArgmaxTest, EveryDtypeAndOddVocab) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t V : {1, 7, 1000, 32001, 128256}) {
      const int64_t rows = 3;
      std::vector<float> values(rows * V);
      for (float& v : values) v = nd(rng);
      values[2 * V + V / 2] = values[2 * V + V - 1] = 9.0f;  // repeated maximum in row 2
      const HostTensor logits = HostTensor::FromFloat(dt, {rows, V}, values);
      const std::vector<float> host = logits.ToFloat();  // as rounded to dt
      void *d_logits = nullptr, *d_ws = nullptr;
      int32_t* d_out = nullptr;
      ASSERT_EQ(cudaMalloc(&d_logits, logits.data.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_out, rows * sizeof(int32_t)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_ws, cuda::ArgmaxWorkspaceBytes(rows)), cudaSuccess);
      ASSERT_EQ(cudaMemset(d_ws, 0, cuda::ArgmaxWorkspaceBytes(rows)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_logits, logits.data.data(), logits.data.size(), cudaMemcpyHostToDevice), cudaSuccess);
      for (void* ws : {d_ws, static_cast<void*>(nullptr)}) {
        ASSERT_EQ(cudaMemset(d_out, 0xff, rows * sizeof(int32_t)), cudaSuccess);
        ASSERT_TRUE(cuda::LaunchArgmaxRows(dt, d_logits, rows, V, d_out, ws, nullptr).ok());
        std::vector<int32_t> got(rows);
        ASSERT_EQ(cudaMemcpy(got.data(), d_out, rows * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_EQ(got[r], cpu::GreedyToken(host.data() + r * V, V))
              << DTypeName(dt) << " V=" << V << " row " << r << (ws ? " (chunks)" : " (one CTA)");
        }
      }
      cudaFree(d_logits);
      cudaFree(d_out);
      cudaFree(d_ws);
    }
  }
}

}  // namespace
}  // namespace fusedserve
