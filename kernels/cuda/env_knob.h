// Integer knobs read from the environment: the A/B switches of the CUDA
// kernels and the model runner (listed in README, "GPU tests and
// benchmarks").
#pragma once

namespace fusedserve::cuda {

// The value of environment variable `name` when it is a whole decimal
// integer in [lo, hi], else `fallback` (unset, empty, out of range or not a
// number). Callers read it once (a function-local static).
int EnvKnob(const char* name, int lo, int hi, int fallback);

}  // namespace fusedserve::cuda
