#include "kernels/cuda/env_knob.h"

#include <cerrno>
#include <cstdlib>

namespace fusedserve::cuda {

int EnvKnob(const char* name, int lo, int hi, int fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(e, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return fallback;
  return static_cast<int>(v);
}

}  // namespace fusedserve::cuda
