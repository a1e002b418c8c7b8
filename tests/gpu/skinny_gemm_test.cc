// The tensor-core skinny GEMM (kernels/cuda/skinny_gemm.h) against the CPU
// reference (cpu::Linear, cpu SiLU * up) on fresh random bf16/fp16 data:
// every token count 9..64 the decode step can hand it (above 32 and with
// hopper = true: the Hopper kernel of skinny_hopper.h, TMA + wgmma, K split
// over clusters of 1-8 CTAs), output widths that are and are not multiples
// of the split and tile counts, K from one chunk to 8192. Outputs are NaN-poisoned first; skipped without a GPU.
#include "kernels/cuda/skinny_gemm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/cuda/skinny_hopper.h"
#include "kernels/dtype.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

uint16_t ToBits(DType dt, float f) { return dt == DType::kBF16 ? FloatToBf16(f) : FloatToHalf(f); }
float FromBits(DType dt, uint16_t b) { return dt == DType::kBF16 ? Bf16ToFloat(b) : HalfToFloat(b); }

struct Device {
  void* p = nullptr;
  explicit Device(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~Device() { cudaFree(p); }
};

// Random values rounded to the dtype; returns the bits and their fp32 values.
void Fill(DType dt, size_t n, float scale, std::mt19937& rng, std::vector<uint16_t>* bits, std::vector<float>* f) {
  std::normal_distribution<float> nd(0.0f, scale);
  bits->resize(n);
  f->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*bits)[i] = ToBits(dt, nd(rng));
    (*f)[i] = FromBits(dt, (*bits)[i]);
  }
}

void Check(DType dt, int64_t M, int64_t N, int64_t K, bool swiglu, bool hopper = false) {
  std::mt19937 rng(static_cast<unsigned>(M * 7919 + N * 31 + K + swiglu));
  const int64_t rows = swiglu ? 2 * N : N;
  std::vector<uint16_t> xb, wb;
  std::vector<float> xf, wf;
  Fill(dt, M * K, 1.0f, rng, &xb, &xf);
  Fill(dt, rows * K, 1.0f / std::sqrt(static_cast<float>(K)), rng, &wb, &wf);
  Device x(xb.size() * 2), w(wb.size() * 2), y(M * N * 2);
  ASSERT_EQ(cudaMemcpy(x.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(w.p, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(y.p, 0xff, M * N * 2), cudaSuccess);  // NaN poison
  // Widths the dispatch does not take (N % 16 != 0) go to the Hopper kernel
  // directly: its epilogue's element-wise tail path (N % 4 != 0).
  const bool direct = hopper && N % 16 != 0;
  if (!direct) {
    ASSERT_TRUE(cuda::SkinnyGemmSupported(dt, M, N, K, x.p, w.p));
  }
  const CudaStatus s = direct   ? cuda::LaunchSkinnyHopper(dt, M, N, K, x.p, w.p, y.p, nullptr)
                       : swiglu ? cuda::LaunchSkinnySwiglu(dt, M, K, N, x.p, w.p, y.p, nullptr)
                                : cuda::LaunchSkinnyGemm(dt, M, N, K, x.p, w.p, y.p, nullptr, hopper);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> yb(M * N);
  ASSERT_EQ(cudaMemcpy(yb.data(), y.p, yb.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> got(M * N), want(M * N), full(M * rows);
  for (size_t i = 0; i < got.size(); ++i) got[i] = FromBits(dt, yb[i]);
  cpu::Linear(xf.data(), wf.data(), nullptr, M, K, rows, Activation::kNone, full.data());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const float a = full[m * rows + n];
      want[m * N + n] = swiglu ? a / (1.0f + std::exp(-a)) * full[m * rows + N + n] : a;
    }
  }
  const double e = RelErrorNorm(got.data(), want.data(), static_cast<int64_t>(got.size()));
  EXPECT_LT(e, dt == DType::kBF16 ? 8e-3 : 2e-3) << DTypeName(dt) << " M=" << M << " N=" << N << " K=" << K
                                                 << (swiglu ? " swiglu" : "") << (hopper ? " hopper" : "");
}

TEST(SkinnyGemmTest, MatchesCpuReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (DType dt : {DType::kBF16, DType::kF16}) {
    const int64_t max_m = cuda::SkinnyHopperAvailable() ? cuda::kSkinnyMaxM : cuda::kSkinnyNarrowMaxM;
    for (int64_t M = 2; M <= max_m; ++M) Check(dt, M, 48, 96, false);
    std::vector<int64_t> ms = {2, 7, 8, 16, 23, 32};
    if (cuda::SkinnyHopperAvailable()) ms.insert(ms.end(), {33, 47, 64});
    for (int64_t M : ms) {
      Check(dt, M, 2048, 2048, false);  // o_proj of the 1B model
      Check(dt, M, 3072, 2048, false);  // qkv
      Check(dt, M, 2048, 8192, false);  // down
      Check(dt, M, 8192, 2048, true);   // gate_up, SwiGLU
      Check(dt, M, 16, 32, true);       // one tile, one chunk
    }
    if (!cuda::SkinnyHopperAvailable()) continue;
    for (int64_t M : {5, 16, 31}) {  // the Hopper kernel below its default range
      Check(dt, M, 2048, 2048, false, true);
      Check(dt, M, 1040, 4000, false, true);
      Check(dt, M, 1037, 1000, false, true);  // N % 4 == 1: element-wise tail stores
      Check(dt, M, 130, 4096, false, true);   // N % 4 == 2, two blocks
    }
    for (int64_t M : {40, 64}) {
      Check(dt, M, 128256 / 8, 2048, false);  // a slice of the LM head: many CTAs, no split
      Check(dt, M, 1040, 4000, false);        // K tail inside a tile; ranks with fewer tiles; partial block
      Check(dt, M, 144, 1056, true);          // SwiGLU over a cluster split, partial block
    }
  }
}

TEST(SkinnyGemmTest, RejectsWhatItCannotRun) {
  EXPECT_FALSE(cuda::SkinnyGemmSupported(DType::kF32, 16, 64, 64, nullptr, nullptr));
  EXPECT_FALSE(cuda::SkinnyGemmSupported(DType::kBF16, cuda::kSkinnyMaxM + 1, 64, 64, nullptr, nullptr));
  if (!cuda::SkinnyHopperAvailable()) {
    EXPECT_FALSE(cuda::SkinnyGemmSupported(DType::kBF16, cuda::kSkinnyNarrowMaxM + 1, 64, 64, nullptr, nullptr));
  }
  EXPECT_FALSE(cuda::SkinnyGemmSupported(DType::kBF16, 16, 40, 64, nullptr, nullptr));  // N % 16
  EXPECT_FALSE(cuda::SkinnyGemmSupported(DType::kBF16, 16, 64, 48, nullptr, nullptr));  // K % 32
}

}  // namespace
}  // namespace fusedserve
