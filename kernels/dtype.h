// Element types and exact float <-> bf16/fp16 conversions (round to nearest
// even). Plain C++ so that CUDA sources, the CPU reference and the server can
// all include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fusedserve {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI64 = 4 };

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

constexpr bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

const char* DTypeName(DType t);

// bfloat16: the upper 16 bits of a binary32, rounded to nearest even. NaN
// stays NaN (quiet bit forced so truncation cannot turn it into Inf).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float f);  // IEEE binary16, round to nearest even
float HalfToFloat(uint16_t h);

}  // namespace fusedserve
