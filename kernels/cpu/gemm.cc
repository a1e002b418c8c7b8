// CPU reference GEMMs: Linear (x . W^T + bias, optional activation epilogue)
// and the SwiGLU MLP built from it. Dot products run along K, which is
// contiguous in both operands, with double accumulators; the weight row is the
// outer loop so it stays in L1 while every x row streams past it. Not fast,
// but M=64, K=N=4096 takes well under a second on one core.
#include <cmath>
#include <vector>

#include "kernels/cpu/reference.h"

namespace fusedserve::cpu {
namespace {

// sum_k a[k] * b[k]. Each float product is exact in double; four partial sums
// break the add dependency chain (4x faster, same accuracy class).
double Dot(const float* a, const float* b, int64_t K) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    s0 += static_cast<double>(a[k]) * b[k];
    s1 += static_cast<double>(a[k + 1]) * b[k + 1];
    s2 += static_cast<double>(a[k + 2]) * b[k + 2];
    s3 += static_cast<double>(a[k + 3]) * b[k + 3];
  }
  for (; k < K; ++k) s0 += static_cast<double>(a[k]) * b[k];
  return (s0 + s1) + (s2 + s3);
}

double Silu(double v) { return v / (1.0 + std::exp(-v)); }

}  // namespace

void Linear(const float* x, const float* weight, const float* bias, int64_t M, int64_t K, int64_t N, Activation act,
            float* y) {
  for (int64_t n = 0; n < N; ++n) {
    const float* w = weight + n * K;
    const double b = bias != nullptr ? bias[n] : 0.0;
    for (int64_t m = 0; m < M; ++m) {
      const double v = Dot(x + m * K, w, K) + b;
      y[m * N + n] = static_cast<float>(act == Activation::kSilu ? Silu(v) : v);
    }
  }
  // GELU epilogue on the fp32 pre-activation, as a fused kernel applies it to
  // its fp32 accumulator.
  if (act == Activation::kGeluErf || act == Activation::kGeluTanh) {
    Gelu(y, M * N, act == Activation::kGeluTanh, y);
  }
}

void SwigluMlp(const float* x, const float* gate_up, const float* down, int64_t M, int64_t D, int64_t I, float* y) {
  // gate_up rows [0, I) are the gate projection, rows [I, 2I) the up projection.
  std::vector<float> gu(M * 2 * I);
  Linear(x, gate_up, nullptr, M, D, 2 * I, Activation::kNone, gu.data());
  std::vector<float> h(M * I);
  SiluAndMul(gu.data(), M, I, h.data());
  Linear(h.data(), down, nullptr, M, I, D, Activation::kNone, y);
}

}  // namespace fusedserve::cpu
