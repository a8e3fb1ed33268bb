// float8_e4m3fn against the OCP FP8 definition, written here in double arithmetic: every
// code's value, round to nearest even at every midpoint, saturation at 448, NaN.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "sdpa/dtype.h"

namespace sdpa {
namespace {

// The value of E4M3 code `bits` (S.EEEE.MMM, bias 7, no infinities, S.1111.111 NaN).
double e4m3_value(int bits) {
  const int exponent = (bits >> 3) & 15, mantissa = bits & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -9)
                                         : std::ldexp(8 + mantissa, exponent - 10);
  return (bits & 0x80) ? -magnitude : magnitude;
}

float8_e4m3fn from_bits(int bits) {
  float8_e4m3fn x;
  x.bits = static_cast<uint8_t>(bits);
  return x;
}

TEST(Float8E4M3FN, EveryCodeHasItsValueAndRoundTrips) {
  for (int bits = 0; bits < 256; ++bits) {
    SCOPED_TRACE(bits);
    const double want = e4m3_value(bits);
    const float got = static_cast<float>(from_bits(bits));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      EXPECT_EQ(float8_e4m3fn(got).bits & 0x7f, 0x7f);
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want);
    EXPECT_EQ(std::signbit(got), (bits & 0x80) != 0);
    EXPECT_EQ(float8_e4m3fn(got).bits, bits);
  }
  EXPECT_EQ(static_cast<float>(from_bits(0x7e)), 448.0f);
  EXPECT_EQ(static_cast<float>(from_bits(0x01)), std::ldexp(1.0f, -9));
}

TEST(Float8E4M3FN, MidpointsRoundToEvenAndNeighboursToNearest) {
  // Consecutive positive finite codes a, a + 1: their midpoint goes to the even code,
  // points just inside either side to that side.
  for (int a = 0; a < 0x7e; ++a) {
    SCOPED_TRACE(a);
    const double lo = e4m3_value(a), hi = e4m3_value(a + 1), mid = (lo + hi) / 2;
    const int even = a % 2 == 0 ? a : a + 1;
    EXPECT_EQ(float8_e4m3fn(static_cast<float>(mid)).bits, even);
    EXPECT_EQ(float8_e4m3fn(static_cast<float>(-mid)).bits, even | 0x80);
    EXPECT_EQ(float8_e4m3fn(static_cast<float>(mid - (hi - lo) / 64)).bits, a);
    EXPECT_EQ(float8_e4m3fn(static_cast<float>(mid + (hi - lo) / 64)).bits, a + 1);
  }
  // Below half the smallest subnormal: zero, keeping the sign.
  EXPECT_EQ(float8_e4m3fn(std::ldexp(1.0f, -11)).bits, 0x00);
  EXPECT_EQ(float8_e4m3fn(-std::ldexp(1.0f, -11)).bits, 0x80);
}

TEST(Float8E4M3FN, SaturatesPast448AndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float big : {449.0f, 464.0f, 480.0f, 1e6f, 3e38f, inf}) {
    SCOPED_TRACE(big);
    EXPECT_EQ(float8_e4m3fn(big).bits, 0x7e);
    EXPECT_EQ(float8_e4m3fn(-big).bits, 0xfe);
  }
  EXPECT_EQ(float8_e4m3fn(std::numeric_limits<float>::quiet_NaN()).bits & 0x7f, 0x7f);
}

}  // namespace
}  // namespace sdpa
