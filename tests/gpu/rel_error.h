// The relative error norm the GPU tests compare with: ||got - want|| / ||want||,
// accumulated in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/tensor.h"

namespace fusedserve {

inline double RelErrorNorm(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Infinite when the sizes differ.
inline double RelErrorNorm(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  return RelErrorNorm(got.data(), want.data(), got.size());
}

inline double RelErrorNorm(const HostTensor& got, const HostTensor& want) {
  return RelErrorNorm(got.ToFloat(), want.ToFloat());
}

}  // namespace fusedserve
