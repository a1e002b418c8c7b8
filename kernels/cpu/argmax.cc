// The greedy token choice: the oracle for kernels/cuda/argmax.cu.
#include <cmath>

#include "kernels/cpu/reference.h"

namespace fusedserve::cpu {

int32_t GreedyToken(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    // Strictly greater keeps the lowest index; a NaN best is replaced by any number.
    if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i]))) best = i;
  }
  return static_cast<int32_t>(best);
}

}  // namespace fusedserve::cpu
