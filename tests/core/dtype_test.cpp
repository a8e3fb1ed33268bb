// dtypes, devices and the 16-bit float types: round to nearest even, inf/nan, float16
// subnormals and overflow, checked against the test's own double-arithmetic rounding.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/reference.h"
#include "sdpa/dtype.h"
#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace sdpa {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, SizesNamesAndParsing) {
  const std::pair<DType, size_t> sizes[] = {
      {DType::kFloat32, 4}, {DType::kFloat64, 8}, {DType::kBFloat16, 2}, {DType::kFloat16, 2},
      {DType::kBool, 1},    {DType::kInt32, 4},   {DType::kInt64, 8},
      {DType::kFloat8E4M3FN, 1}};
  for (const auto& [d, size] : sizes) {
    EXPECT_EQ(element_size(d), size);
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  EXPECT_EQ(dtype_name(DType::kFloat32), "float32");
  EXPECT_EQ(dtype_name(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(dtype_name(DType::kFloat16), "float16");
  EXPECT_EQ(dtype_name(DType::kBool), "bool");
  EXPECT_THROW(parse_dtype("float8"), Error);
  EXPECT_THROW(parse_dtype(""), Error);
  EXPECT_TRUE(is_floating(DType::kFloat32));
  EXPECT_TRUE(is_floating(DType::kFloat64));
  EXPECT_TRUE(is_floating(DType::kBFloat16));
  EXPECT_TRUE(is_floating(DType::kFloat16));
  EXPECT_FALSE(is_floating(DType::kBool));
  EXPECT_FALSE(is_floating(DType::kInt32));
  EXPECT_FALSE(is_floating(DType::kInt64));
  EXPECT_FALSE(is_floating(DType::kFloat8E4M3FN));  // a cache storage type only
}

TEST(Device, NamesAndEquality) {
  EXPECT_EQ(device_name(Device{}), "cpu");
  EXPECT_EQ(device_name({DeviceType::kCUDA, 0}), "cuda:0");
  EXPECT_EQ(device_name({DeviceType::kExternal, 1}), "external:1");
  EXPECT_EQ((Device{DeviceType::kCUDA, 1}), (Device{DeviceType::kCUDA, 1}));
  EXPECT_NE((Device{DeviceType::kCUDA, 1}), (Device{DeviceType::kCUDA, 0}));
  EXPECT_EQ(static_cast<int>(DeviceType::kCPU), 1);  // DLPack's kDLCPU
  EXPECT_EQ(static_cast<int>(DeviceType::kCUDA), 2);
}

// ---- bfloat16 -----------------------------------------------------------------------

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(float(bfloat16(1.0f)), 1.0f);
  EXPECT_EQ(float(bfloat16(1.0f + 0x1p-8f)), 1.0f);               // tie, even is 1
  EXPECT_EQ(float(bfloat16(1.0f + 0x1p-7f + 0x1p-8f)), 1.0f + 0x1p-6f);  // tie, up to even
  EXPECT_EQ(float(bfloat16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);  // above tie
  EXPECT_EQ(float(bfloat16(-1.0f - 0x1p-8f - 0x1p-20f)), -1.0f - 0x1p-7f);
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bfloat16(-2.0f).bits, 0xc000);
}

TEST(BFloat16, InfinityNanOverflowAndSubnormals) {
  EXPECT_EQ(float(bfloat16(kInfF)), kInfF);
  EXPECT_EQ(float(bfloat16(-kInfF)), -kInfF);
  EXPECT_TRUE(std::isnan(float(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low 16 bits must not become infinity.
  EXPECT_TRUE(std::isnan(float(bfloat16(bits_to_float(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(float(bfloat16(bits_to_float(0xff800001u)))));
  // FLT_MAX lies above the midpoint between bf16's max and 2^128: rounds to infinity.
  EXPECT_EQ(float(bfloat16(std::numeric_limits<float>::max())), kInfF);
  EXPECT_EQ(bfloat16(bits_to_float(0x7f7f7fffu)).bits, 0x7f7f);  // just below midpoint
  // float32 subnormals survive (bfloat16 shares float32's exponent range).
  EXPECT_EQ(float(bfloat16(0x1p-133f)), 0x1p-133f);
  EXPECT_EQ(bfloat16(-0.0f).bits, 0x8000);
}

TEST(BFloat16, ExhaustiveRoundTripAndRandomFloats) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    bfloat16 x;
    x.bits = static_cast<uint16_t>(b);
    const float f = float(x);
    const double expected = test::decode_bfloat16(x.bits);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), expected) << std::hex << b;
    ASSERT_EQ(bfloat16(f).bits, x.bits) << std::hex << b;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_to_float(rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(bfloat16(f).bits, test::encode_bfloat16(f)) << f;
  }
}

// ---- float16 ------------------------------------------------------------------------

TEST(Float16, RoundsToNearestEven) {
  EXPECT_EQ(float(float16(1.0f)), 1.0f);
  EXPECT_EQ(float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float(float16(1.0f + 0x1p-11f)), 1.0f);                         // tie -> even
  EXPECT_EQ(float(float16(1.0f + 0x1p-10f + 0x1p-11f)), 1.0f + 0x1p-9f);   // tie -> even (up)
  EXPECT_EQ(float(float16(1.0f + 0x1p-11f + 0x1p-20f)), 1.0f + 0x1p-10f);  // above tie
  EXPECT_EQ(float(float16(0.1f)), 0.0999755859375f);
  EXPECT_EQ(float16(-0.0f).bits, 0x8000);
}

TEST(Float16, OverflowGoesToInfinity) {
  EXPECT_EQ(float(float16(65504.0f)), 65504.0f);
  EXPECT_EQ(float(float16(65519.0f)), 65504.0f);  // below the midpoint
  EXPECT_EQ(float(float16(65520.0f)), kInfF);     // the midpoint rounds to even: infinity
  EXPECT_EQ(float(float16(1e5f)), kInfF);
  EXPECT_EQ(float(float16(-1e5f)), -kInfF);
  EXPECT_EQ(float(float16(std::numeric_limits<float>::max())), kInfF);
  EXPECT_EQ(float16(kInfF).bits, 0x7c00);
  EXPECT_EQ(float16(-kInfF).bits, 0xfc00);
  EXPECT_TRUE(std::isnan(float(float16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(float(float16(bits_to_float(0x7f800001u)))));  // low-bit payload
}

TEST(Float16, SubnormalsAreKept) {
  EXPECT_EQ(float16(0x1p-24f).bits, 0x0001);            // smallest subnormal
  EXPECT_EQ(float(float16(0x1p-24f)), 0x1p-24f);
  EXPECT_EQ(float16(0x1p-25f).bits, 0x0000);            // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(float16(0x1.8p-25f).bits, 0x0001);          // above the tie
  EXPECT_EQ(float16(0x1.8p-24f).bits, 0x0002);          // tie between 1 and 2 -> 2
  EXPECT_EQ(float16(1023 * 0x1p-24f).bits, 0x03ff);     // largest subnormal
  EXPECT_EQ(float16(0x1p-14f).bits, 0x0400);            // smallest normal
  EXPECT_EQ(float16(0x1p-14f - 0x1p-25f).bits, 0x0400);  // rounds up across the boundary
  EXPECT_EQ(float16(-0x1p-24f).bits, 0x8001);
  EXPECT_EQ(float16(1e-10f).bits, 0x0000);
}

TEST(Float16, ExhaustiveRoundTripAndRandomFloats) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float16 x;
    x.bits = static_cast<uint16_t>(b);
    const float f = float(x);
    const double expected = test::decode_float16(x.bits);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), expected) << std::hex << b;
    ASSERT_EQ(float16(f).bits, x.bits) << std::hex << b;
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> exponent(90, 160);  // around float16's range
  for (int i = 0; i < 300000; ++i) {
    // Random sign and mantissa; exponents concentrated where float16 rounds.
    const uint32_t u = (rng() & 0x807fffffu) | (static_cast<uint32_t>(exponent(rng)) << 23);
    const float f = bits_to_float(u);
    ASSERT_EQ(float16(f).bits, test::encode_float16(f)) << f;
  }
}

// Tensor::to and item use the same conversions.
TEST(Float16, TensorConversionsAgreeWithScalarOnes) {
  std::mt19937 rng(3);
  Tensor t = Tensor::empty({4096}, DType::kFloat32);
  std::vector<double> values(4096);
  std::uniform_int_distribution<int> exponent(95, 150);
  for (double& v : values) {
    v = bits_to_float((rng() & 0x807fffffu) | (static_cast<uint32_t>(exponent(rng)) << 23));
  }
  values[0] = 65520.0;
  values[1] = 0x1p-25;
  values[2] = -kInfF;
  test::fill_from_doubles(t, values);
  const auto h = test::to_doubles(t.to(DType::kFloat16));
  const auto b = test::to_doubles(t.to(DType::kBFloat16));
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(h[i], test::round_to_dtype(values[i], DType::kFloat16)) << values[i];
    ASSERT_EQ(b[i], test::round_to_dtype(values[i], DType::kBFloat16)) << values[i];
  }
  // And back up: half -> float32 -> float64 is exact.
  const auto back = test::to_doubles(t.to(DType::kFloat16).to(DType::kFloat64));
  EXPECT_EQ(back, h);
}

}  // namespace
}  // namespace sdpa
