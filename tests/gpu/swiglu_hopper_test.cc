// The fused Hopper SwiGLU gate GEMM (kernels/cuda/swiglu_hopper.h) against
// the CPU reference (cpu::Linear, then silu(gate) * up) on fresh random
// bf16/fp16 data: row counts at the 64-row warpgroup and 128-row tile edges
// (1, 63, 64, 65, 127, 4096 + odd), D not a multiple of the 64-wide k tile,
// I not a multiple of the 128-wide column tile; the default kernel and the
// 2-CTA cluster variant. Outputs are NaN-poisoned first. Skipped without a
// GPU; the kernel needs compute capability 9.0 and the test checks that it
// refuses other devices and unsupported shapes.
#include "kernels/cuda/swiglu_hopper.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/reference.h"
#include "kernels/dtype.h"
#include "tests/gpu/rel_error.h"

namespace fusedserve {
namespace {

bool HaveHopper(bool* any_gpu) {
  int n = 0;
  *any_gpu = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!*any_gpu) return false;
  cudaDeviceProp p;
  return cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major == 9 && p.minor == 0;
}

uint16_t ToBits(DType dt, float f) { return dt == DType::kBF16 ? FloatToBf16(f) : FloatToHalf(f); }
float FromBits(DType dt, uint16_t b) { return dt == DType::kBF16 ? Bf16ToFloat(b) : HalfToFloat(b); }

struct Device {
  void* p = nullptr;
  explicit Device(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~Device() { cudaFree(p); }
};

void Fill(DType dt, size_t n, float scale, std::mt19937& rng, std::vector<uint16_t>* bits, std::vector<float>* f) {
  std::normal_distribution<float> nd(0.0f, scale);
  bits->resize(n);
  f->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*bits)[i] = ToBits(dt, nd(rng));
    (*f)[i] = FromBits(dt, (*bits)[i]);
  }
}

void Check(DType dt, int64_t M, int64_t D, int64_t I, std::mt19937& rng, const cuda::HopperSwigluOptions& o) {
  std::vector<uint16_t> xb, wb;
  std::vector<float> xf, wf;
  Fill(dt, M * D, 1.0f, rng, &xb, &xf);
  Fill(dt, 2 * I * D, 2.0f / std::sqrt(static_cast<float>(D)), rng, &wb, &wf);
  Device x(xb.size() * 2), w(wb.size() * 2), h(M * I * 2);
  ASSERT_EQ(cudaMemcpy(x.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(w.p, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(h.p, 0xff, M * I * 2), cudaSuccess);  // NaN poison
  ASSERT_TRUE(cuda::HopperSwigluSupported(dt, M, D, I, x.p, w.p, h.p));
  const CudaStatus s = cuda::LaunchHopperSwiglu(dt, M, D, I, x.p, w.p, h.p, nullptr, o);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> hb(M * I);
  ASSERT_EQ(cudaMemcpy(hb.data(), h.p, hb.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> got(M * I), want(M * I), full(M * 2 * I);
  for (size_t i = 0; i < got.size(); ++i) got[i] = FromBits(dt, hb[i]);
  cpu::Linear(xf.data(), wf.data(), nullptr, M, D, 2 * I, Activation::kNone, full.data());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < I; ++n) {
      const float g = full[m * 2 * I + n];
      want[m * I + n] = g / (1.0f + std::exp(-g)) * full[m * 2 * I + I + n];
    }
  }
  const double e = RelErrorNorm(got.data(), want.data(), got.size());
  EXPECT_LT(e, dt == DType::kBF16 ? 8e-3 : 2e-3)
      << DTypeName(dt) << " M=" << M << " D=" << D << " I=" << I << " cluster=" << o.cluster << " group=" << o.group_m;
  std::printf("swiglu_hopper %s M=%lld D=%lld I=%lld cluster=%d group=%d rel_err=%.2e\n", DTypeName(dt),
              static_cast<long long>(M), static_cast<long long>(D), static_cast<long long>(I), o.cluster, o.group_m, e);
}

TEST(SwigluHopperTest, MatchesCpuReference) {
  bool any_gpu = false;
  if (!HaveHopper(&any_gpu)) GTEST_SKIP() << (any_gpu ? "not compute capability 9.0" : "no CUDA device");
  std::mt19937 rng(std::random_device{}());
  cuda::HopperSwigluOptions plain, pairs, pairs_g1;  // plain: the defaults, no clusters
  pairs.cluster = 2;
  pairs_g1.cluster = 2;
  pairs_g1.group_m = 1;
  for (const cuda::HopperSwigluOptions& o : {plain, pairs}) {
    for (DType dt : {DType::kBF16, DType::kF16}) {
      for (int64_t M : {1, 63, 64, 65, 127, 128, 129, 255, 257}) {
        Check(dt, M, 256, 256, rng, o);  // whole tiles in D and I
        Check(dt, M, 200, 136, rng, o);  // k tail (200 = 3*64 + 8), column tail (136 = 128 + 8 < 128 + 64)
      }
      Check(dt, 4097, 512, 264, rng, o);   // many tiles over a persistent grid, tails in M and I
      Check(dt, 300, 8, 8, rng, o);        // the smallest D and I
      Check(dt, 257, 2048, 1048, rng, o);  // a long k loop (32 k tiles, pipeline phases wrap), I tail past 64
    }
  }
  Check(DType::kBF16, 1000, 256, 2048, rng, pairs_g1);  // another tile walk
}

TEST(SwigluHopperTest, RefusesWhatItCannotRun) {
  bool any_gpu = false;
  const bool hopper = HaveHopper(&any_gpu);
  if (!any_gpu) GTEST_SKIP() << "no CUDA device";
  EXPECT_FALSE(cuda::HopperSwigluSupported(DType::kF32, 64, 64, 64, nullptr, nullptr, nullptr));
  EXPECT_FALSE(cuda::HopperSwigluSupported(DType::kBF16, 64, 60, 64, nullptr, nullptr, nullptr));  // D % 8
  EXPECT_FALSE(cuda::HopperSwigluSupported(DType::kBF16, 64, 64, 36, nullptr, nullptr, nullptr));  // I % 8
  EXPECT_FALSE(cuda::HopperSwigluSupported(DType::kBF16, 0, 64, 64, nullptr, nullptr, nullptr));
  const char* misaligned = reinterpret_cast<const char*>(256) + 2;
  EXPECT_FALSE(cuda::HopperSwigluSupported(DType::kBF16, 64, 64, 64, misaligned, nullptr, nullptr));
  EXPECT_EQ(cuda::HopperSwigluSupported(DType::kBF16, 64, 64, 64, nullptr, nullptr, nullptr), hopper);
  const CudaStatus s = cuda::LaunchHopperSwiglu(DType::kBF16, 64, 60, 64, nullptr, nullptr, nullptr, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.unsupported) << s.message;
}

}  // namespace
}  // namespace fusedserve
