// CPU reference row softmax: subtract the row max, exponentiate and
// normalise, in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/reference.h"

namespace fusedserve::cpu {

void Softmax(const float* x, int64_t M, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * N;
    float* yr = y + m * N;
    float max_v = -std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < N; ++n) max_v = std::max(max_v, xr[n]);
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += std::exp(static_cast<double>(xr[n]) - max_v);
    for (int64_t n = 0; n < N; ++n) yr[n] = static_cast<float>(std::exp(static_cast<double>(xr[n]) - max_v) / sum);
  }
}

}  // namespace fusedserve::cpu
