// CPU reference activations: SwiGLU's silu(gate) * up and GELU (exact erf
// form or the tanh approximation). Evaluated in double, rounded once.
#include <cmath>

#include "kernels/cpu/reference.h"

namespace fusedserve::cpu {

void SiluAndMul(const float* x, int64_t M, int64_t I, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    const float* gate = x + m * 2 * I;
    const float* up = gate + I;
    for (int64_t i = 0; i < I; ++i) {
      const double g = gate[i];
      y[m * I + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
    }
  }
}

// y may alias x (Linear applies its epilogue in place).
void Gelu(const float* x, int64_t n, bool tanh_approx, float* y) {
  const double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double g = tanh_approx ? 0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * (v + 0.044715 * v * v * v)))
                                 : 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    y[i] = static_cast<float>(g);
  }
}

}  // namespace fusedserve::cpu
