#include "kernels/tensor.h"

#include <cstring>

namespace fusedserve {

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void HostTensor::Own() {
  if (view == nullptr) return;
  data.assign(view, view_size);
  ClearView();
}

std::vector<float> HostTensor::ToFloat() const {
  const int64_t n = numel();
  std::vector<float> out(n);
  const char* p = bytes().data();
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out.data(), p, n * 4);
      break;
    // One loop per dtype (the CPU backend converts every request's tensors,
    // so this is on the serving path): the bf16 loop vectorises.
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = Bf16ToFloat(h);
      }
      break;
    case DType::kI32:
    case DType::kI64: {
      const std::vector<int64_t> ints = ToInt64();
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(ints[i]);
      break;
    }
  }
  return out;
}

std::vector<int64_t> HostTensor::ToInt64() const {
  const int64_t n = numel();
  std::vector<int64_t> out(n);
  if (IsFloat(dtype)) {
    const std::vector<float> floats = ToFloat();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int64_t>(floats[i]);
    return out;
  }
  const char* p = bytes().data();
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kI64) {
      std::memcpy(&out[i], p + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
    }
  }
  return out;
}

HostTensor HostTensor::FromFloat(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t n = values.size();
  t.data.resize(n * DTypeSize(dtype));
  char* p = t.data.data();
  // The dtype switch outside the loops (see ToFloat).
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(p, values.data(), 4 * n);
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = FloatToHalf(values[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      break;
    case DType::kBF16:
      // FloatToBf16 (dtype.h) with both results computed and one selected,
      // so that the loop has no branch and vectorises; the dtype test checks
      // the two agree on every bit pattern class (NaN, Inf, halfway cases).
      // (restrict: the output is chars, which may alias anything.)
      {
        const float* __restrict src = values.data();
        char* __restrict dst = p;
        for (size_t i = 0; i < n; ++i) {
          uint32_t u;
          std::memcpy(&u, src + i, 4);
          const uint32_t nan = (u >> 16) | 0x40;
          const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
          const uint16_t h = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
          std::memcpy(dst + 2 * i, &h, 2);
        }
      }
      break;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) {
        const int32_t v = static_cast<int32_t>(values[i]);
        std::memcpy(p + 4 * i, &v, 4);
      }
      break;
    case DType::kI64:
      for (size_t i = 0; i < n; ++i) {
        const int64_t v = static_cast<int64_t>(values[i]);
        std::memcpy(p + 8 * i, &v, 8);
      }
      break;
  }
  return t;
}

HostTensor HostTensor::FromInt64(DType dtype, std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kI32) {
      int32_t v = static_cast<int32_t>(values[i]);
      std::memcpy(t.data.data() + 4 * i, &v, 4);
    } else {
      std::memcpy(t.data.data() + 8 * i, &values[i], 8);
    }
  }
  return t;
}

}  // namespace fusedserve
