// bf16/fp16 conversions (kernels/dtype.h) checked exhaustively over all 65536
// bit patterns and against an independent round-to-nearest-even built from the
// sorted list of representable values; then HostTensor's conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace fusedserve {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Value of a 16-bit float with the given exponent/mantissa widths, from its
// fields (inf as +-inf; NaN as NaN).
double Decode16(uint16_t h, int exp_bits, int mant_bits) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t mant_mask = (1u << mant_bits) - 1, exp_max = (1u << exp_bits) - 1;
  const double sign = (h >> 15) ? -1.0 : 1.0;
  const uint32_t e = (h >> mant_bits) & exp_max, m = h & mant_mask;
  if (e == exp_max) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
  return sign * std::ldexp(static_cast<double>(m | (1u << mant_bits)), static_cast<int>(e) - bias - mant_bits);
}
double DecodeHalf(uint16_t h) { return Decode16(h, 5, 10); }
double DecodeBf16(uint16_t h) { return Decode16(h, 8, 7); }

bool IsNan16(uint16_t h, int mant_bits) {
  const uint32_t exp_max = (0x7fffu >> mant_bits);
  return ((h >> mant_bits) & exp_max) == exp_max && (h & ((1u << mant_bits) - 1)) != 0;
}

// Round-to-nearest-even by search: the non-negative finite patterns of a
// 16-bit float are monotone in value, and the pattern after the largest finite
// one is +inf, which IEEE rounding treats as the next step up (2^emax+1).
class RneOracle {
 public:
  RneOracle(uint16_t inf_bits, double (*decode)(uint16_t)) : inf_bits_(inf_bits) {
    for (uint32_t h = 0; h < inf_bits; ++h) values_.push_back(decode(static_cast<uint16_t>(h)));
    // Where inf sits for rounding: one ulp past the largest finite value.
    values_.push_back(values_.back() + (values_.back() - values_[inf_bits - 2]));
  }
  uint16_t Round(float f) const {
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(f));
    if (std::isinf(a) || a >= values_.back()) return sign | inf_bits_;
    // First pattern with value >= a.
    const size_t hi = std::lower_bound(values_.begin(), values_.end(), a) - values_.begin();
    if (values_[hi] == a) return sign | static_cast<uint16_t>(hi);
    const size_t lo = hi - 1;
    const double dlo = a - values_[lo], dhi = values_[hi] - a;
    size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | static_cast<uint16_t>(pick);
  }

 private:
  std::vector<double> values_;
  uint16_t inf_bits_;
};

const RneOracle& HalfOracle() {
  static const RneOracle* o = new RneOracle(0x7c00, DecodeHalf);
  return *o;
}
const RneOracle& Bf16Oracle() {
  static const RneOracle* o = new RneOracle(0x7f80, DecodeBf16);
  return *o;
}

// ---- exhaustive over the 16-bit patterns ----------------------------------------

TEST(Fp16, EveryPatternDecodesAndRoundTrips) {
  int nans = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    if (IsNan16(h, 10)) {
      ++nans;
      EXPECT_TRUE(std::isnan(f)) << std::hex << i;
      EXPECT_TRUE(IsNan16(FloatToHalf(f), 10)) << std::hex << i;
      continue;
    }
    const double want = DecodeHalf(h);
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << i;
    ASSERT_EQ(std::signbit(f), (h >> 15) != 0) << std::hex << i;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << i;
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Bf16, EveryPatternDecodesAndRoundTrips) {
  int nans = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = Bf16ToFloat(h);
    if (IsNan16(h, 7)) {
      ++nans;
      EXPECT_TRUE(std::isnan(f)) << std::hex << i;
      EXPECT_TRUE(IsNan16(FloatToBf16(f), 7)) << std::hex << i;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), DecodeBf16(h)) << std::hex << i;
    ASSERT_EQ(std::signbit(f), (h >> 15) != 0) << std::hex << i;
    ASSERT_EQ(FloatToBf16(f), h) << std::hex << i;
  }
  EXPECT_EQ(nans, 2 * 127);
}

// ---- halfway cases and their neighbours, for every pair of adjacent values -------

// For each finite non-negative pattern h and the next one up, the exact
// midpoint (representable in fp32: it needs one more mantissa bit than the
// 16-bit type) must round to whichever of the two is even, and one fp32 ulp
// either side must round to the nearer one.
template <typename ToF, typename FromF>
void CheckMidpoints(uint16_t inf_bits, ToF to_float, FromF from_float) {
  for (uint32_t h = 0; h < inf_bits; ++h) {
    const double lo = to_float(static_cast<uint16_t>(h));
    // The value one step up; for the largest finite value, that step leads to inf.
    const double hi =
        h + 1 < inf_bits ? to_float(static_cast<uint16_t>(h + 1)) : lo + (lo - to_float(static_cast<uint16_t>(h - 1)));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "midpoint not exact in fp32 at " << h;
    const uint16_t even = static_cast<uint16_t>(h % 2 == 0 ? h : h + 1);
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(from_float(sign * mid), s | even) << std::hex << "halfway above " << h;
      ASSERT_EQ(from_float(sign * std::nextafter(mid, 0.0f)), s | h) << std::hex << "just below halfway above " << h;
      ASSERT_EQ(from_float(sign * std::nextafter(mid, INFINITY)), s | (h + 1))
          << std::hex << "just above halfway above " << h;
    }
  }
}

TEST(Fp16, HalfwayCasesRoundToEven) {
  CheckMidpoints(
      0x7c00, [](uint16_t h) { return static_cast<double>(HalfToFloat(h)); }, FloatToHalf);
}

TEST(Bf16, HalfwayCasesRoundToEven) {
  CheckMidpoints(
      0x7f80, [](uint16_t h) { return static_cast<double>(Bf16ToFloat(h)); }, FloatToBf16);
}

// ---- random fp32 inputs against the search oracle -------------------------------------

TEST(Fp16, RandomFloatsMatchOracle) {
  std::mt19937 rng(1234);
  // Exponents around fp16's range (2^-30 .. 2^20), random mantissa and sign.
  std::uniform_int_distribution<uint32_t> exp_dist(97, 147), mant_dist(0, (1u << 23) - 1), sign_dist(0, 1);
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits((sign_dist(rng) << 31) | (exp_dist(rng) << 23) | mant_dist(rng));
    ASSERT_EQ(FloatToHalf(f), HalfOracle().Round(f)) << std::hexfloat << f;
  }
}

TEST(Bf16, RandomFloatsMatchOracle) {
  std::mt19937 rng(5678);
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), Bf16Oracle().Round(f)) << std::hexfloat << f;
  }
}

// ---- named edge cases -------------------------------------------------------------------

TEST(Fp16, OverflowUnderflowAndSpecials) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);                        // largest finite
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // just under halfway to 2^16
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                        // halfway, 0x7bff odd -> inf
  EXPECT_EQ(FloatToHalf(1e9f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToHalf(INFINITY), 0x7c00);
  EXPECT_EQ(FloatToHalf(-INFINITY), 0xfc00);
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)) && HalfToFloat(0x7c00) > 0);
  // Subnormals: 2^-24 is the smallest; 2^-25 is halfway to zero -> 0 (even).
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -24)), 0x0002);     // 1.5 ulp -> 2 (even)
  EXPECT_EQ(FloatToHalf(std::ldexp(2.5f, -24)), 0x0002);     // 2.5 ulp -> 2 (even)
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-10f), 0x8000);  // sign survives underflow
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // halfway, 0x3c00 even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // halfway, 0x3c01 odd
  // NaN of either sign and any payload stays NaN (never inf).
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fa00000u, 0xff800001u}) {
    EXPECT_TRUE(IsNan16(FloatToHalf(FromBits(bits)), 10)) << std::hex << bits;
  }
  EXPECT_TRUE(IsNan16(FloatToHalf(std::numeric_limits<float>::quiet_NaN()), 10));
}

TEST(Bf16, OverflowUnderflowAndSpecials) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);        // halfway, 0x3f80 even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);    // halfway, 0x3f81 odd
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);  // past the halfway point to 2^128
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f7fffu)), 0x7f7f);  // just below halfway: largest finite
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7f8000u)), 0x7f80);  // halfway, 0x7f7f odd -> inf
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBf16(-INFINITY), 0xff80);
  // fp32 subnormals keep their top bits (bf16 has the same exponent range).
  EXPECT_EQ(FloatToBf16(FromBits(0x00010000u)), 0x0001);
  EXPECT_EQ(FloatToBf16(FromBits(0x00008000u)), 0x0000);  // halfway to zero -> 0 (even)
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000u)), 0x0002);  // halfway, 0x0001 odd -> 2
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  // The rounding carry must not turn a NaN whose low bits are set into inf.
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
    const uint16_t h = FloatToBf16(FromBits(bits));
    EXPECT_TRUE(IsNan16(h, 7)) << std::hex << bits << " -> " << h;
    EXPECT_EQ(h >> 15, bits >> 31) << "NaN sign";
  }
}

// ---- HostTensor ------------------------------------------------------------------------

TEST(HostTensor, FromFloatToFloatPerDType) {
  const std::vector<float> values = {0.0f, -0.0f, 1.0f, -2.5f, 3.14159265f, 1e-6f, -65504.0f, 70000.0f, 1e-30f};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const HostTensor t = HostTensor::FromFloat(dt, {3, 3}, values);
    EXPECT_EQ(t.dtype, dt);
    EXPECT_EQ(t.numel(), 9);
    ASSERT_EQ(t.data.size(), 9 * DTypeSize(dt));
    const std::vector<float> back = t.ToFloat();
    ASSERT_EQ(back.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float want = dt == DType::kF32   ? values[i]
                         : dt == DType::kF16 ? HalfToFloat(FloatToHalf(values[i]))
                                             : Bf16ToFloat(FloatToBf16(values[i]));
      EXPECT_EQ(Bits(back[i]), Bits(want)) << i;
    }
  }
  // fp16 saturates to inf above 65520; bf16 keeps 70000 finite.
  EXPECT_TRUE(std::isinf(HostTensor::FromFloat(DType::kF16, {1}, {70000.0f}).ToFloat()[0]));
  EXPECT_EQ(HostTensor::FromFloat(DType::kBF16, {1}, {70000.0f}).ToFloat()[0], 70144.0f);
}

// FromFloat's bf16 loop rounds without a branch: the same bits as FloatToBf16
// for every 2^32 / 65521-th pattern (all classes: NaNs, infinities, zeros,
// denormals, halfway cases).
TEST(HostTensor, FromFloatBf16MatchesFloatToBf16) {
  std::vector<float> values;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &bits, 4);
    values.push_back(f);
  }
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u, 0xffffffffu, 0x3f808000u, 0x3f818000u,
                        0x00008000u, 0x80000000u, 0x7f7fffffu}) {
    float f;
    std::memcpy(&f, &bits, 4);
    values.push_back(f);
  }
  const HostTensor t = HostTensor::FromFloat(DType::kBF16, {static_cast<int64_t>(values.size())}, values);
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, t.data.data() + 2 * i, 2);
    ASSERT_EQ(h, FloatToBf16(values[i])) << i;
  }
}

TEST(HostTensor, WireBytesAreLittleEndian) {
  const HostTensor h = HostTensor::FromFloat(DType::kF16, {2}, {1.0f, -2.0f});
  EXPECT_EQ(h.data, std::string("\x00\x3c\x00\xc0", 4));
  const HostTensor b = HostTensor::FromFloat(DType::kBF16, {1}, {1.0f});
  EXPECT_EQ(b.data, std::string("\x80\x3f", 2));
  const HostTensor f = HostTensor::FromFloat(DType::kF32, {1}, {1.0f});
  EXPECT_EQ(f.data, std::string("\x00\x00\x80\x3f", 4));
  const HostTensor i32 = HostTensor::FromInt64(DType::kI32, {1}, {-2});
  EXPECT_EQ(i32.data, std::string("\xfe\xff\xff\xff", 4));
}

TEST(HostTensor, Int64RoundTrip) {
  const std::vector<int64_t> values = {0, 1, -1, 2147483647, -2147483648LL, 123456};
  const HostTensor t32 = HostTensor::FromInt64(DType::kI32, {6}, values);
  EXPECT_EQ(t32.data.size(), 24u);
  EXPECT_EQ(t32.ToInt64(), values);
  std::vector<int64_t> wide = values;
  wide.push_back(int64_t{1} << 40);
  wide.push_back(-(int64_t{1} << 50));
  const HostTensor t64 = HostTensor::FromInt64(DType::kI64, {2, 4}, wide);
  EXPECT_EQ(t64.data.size(), 64u);
  EXPECT_EQ(t64.ToInt64(), wide);
  // Integer tensors read as floats, and float tensors truncated to ints.
  EXPECT_EQ(t32.ToFloat()[2], -1.0f);
  EXPECT_EQ(HostTensor::FromFloat(DType::kF32, {3}, {2.75f, -2.75f, 7.0f}).ToInt64(), (std::vector<int64_t>{2, -2, 7}));
}

TEST(HostTensor, ShapeHelpers) {
  HostTensor scalar;
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.rank(), 0);
  const HostTensor t = HostTensor::FromFloat(DType::kF32, {2, 3, 5}, std::vector<float>(30, 1.0f));
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.rank(), 3);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(t.dim(-3), 2);
  const HostTensor empty = HostTensor::FromFloat(DType::kF16, {4, 0}, {});
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.ToFloat().empty());
}

}  // namespace
}  // namespace fusedserve
