// CPU reference rotary position embedding, LLaMA rotate-half layout: element
// i of each head is rotated together with element i + D/2. Angles are computed
// in double: positions reach 1e5+ and pos * inv_freq loses whole radians'
// worth of precision in fp32.
#include <cmath>
#include <vector>

#include "kernels/cpu/reference.h"

namespace fusedserve::cpu {
namespace {

// Rotates every head of one token.   in, out [heads, D]
void RotateHeads(const float* in, int64_t heads, int64_t D, const std::vector<double>& cos_v,
                 const std::vector<double>& sin_v, float* out) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* x = in + h * D;
    float* o = out + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const double x1 = x[i], x2 = x[i + half];
      o[i] = static_cast<float>(x1 * cos_v[i] - x2 * sin_v[i]);
      o[i + half] = static_cast<float>(x2 * cos_v[i] + x1 * sin_v[i]);
    }
  }
}

}  // namespace

// D must be even (validation checks it).
void Rope(const float* q, const float* k, const int64_t* positions, int64_t T, int64_t Hq, int64_t Hkv, int64_t D,
          double theta, float* q_out, float* k_out) {
  const int64_t half = D / 2;
  std::vector<double> inv_freq(half), cos_v(half), sin_v(half);
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / D);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq[i];
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
    RotateHeads(q + t * Hq * D, Hq, D, cos_v, sin_v, q_out + t * Hq * D);
    RotateHeads(k + t * Hkv * D, Hkv, D, cos_v, sin_v, k_out + t * Hkv * D);
  }
}

}  // namespace fusedserve::cpu
