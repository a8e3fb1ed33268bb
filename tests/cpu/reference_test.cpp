// Checks of the oracle itself (tests/common/reference.*): if these fail, every other
// comparison in this suite is meaningless. Also pins the library's private Philox to the
// published known answers.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/harness.h"
#include "common/reference.h"
#include "cpu/philox.h"

namespace sdpa::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Random123's kat_vectors for philox4x32 with 10 rounds.
struct Kat {
  std::array<uint32_t, 4> counter;
  std::array<uint32_t, 2> key;
  std::array<uint32_t, 4> expected;
};
const Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(ReferencePhilox, KnownAnswers) {
  for (const Kat& kat : kKats) EXPECT_EQ(philox4x32_10(kat.counter, kat.key), kat.expected);
}

TEST(LibraryPhilox, KnownAnswersAndAgreesWithTheTestPhilox) {
  for (const Kat& kat : kKats) EXPECT_EQ(cpu::philox4x32_10(kat.counter, kat.key), kat.expected);
  std::mt19937 rng(1);
  auto u32 = [&] { return static_cast<uint32_t>(rng()); };
  for (int i = 0; i < 1000; ++i) {
    const std::array<uint32_t, 4> c{u32(), u32(), u32(), u32()};
    const std::array<uint32_t, 2> k{u32(), u32()};
    ASSERT_EQ(cpu::philox4x32_10(c, k), philox4x32_10(c, k));
  }
}

// The library's keep decisions are the documented rule (element n: word n % 4 of block
// n / 4 at counter (n / 4, offset), kept when word >= p * 2^32).
TEST(LibraryPhilox, DropoutStreamFollowsTheDocumentedRule) {
  const PhiloxState state{0x0123456789abcdefull, 0x100000007ull};
  for (double p : {0.0, 0.1, 0.5, 0.99}) {
    const cpu::DropoutStream stream(state, p);
    for (uint64_t first : {0ull, 3ull, 1ull << 33}) {
      std::vector<double> values(37, 1.0);
      stream.apply(first, values.data(), static_cast<int64_t>(values.size()));
      for (size_t j = 0; j < values.size(); ++j) {
        const bool kept = dropout_keeps(state, p, first + j);
        EXPECT_EQ(values[j], kept ? 1.0 / (1.0 - p) : 0.0) << "p=" << p << " n=" << first + j;
      }
    }
  }
}

TEST(ReferenceRounding, HalfTypes) {
  EXPECT_EQ(round_to_dtype(1.0 + std::ldexp(1.0, -11), DType::kFloat16), 1.0);  // tie: even
  EXPECT_EQ(round_to_dtype(1.0 + 3 * std::ldexp(1.0, -11), DType::kFloat16),
            1.0 + std::ldexp(1.0, -9));
  EXPECT_EQ(round_to_dtype(65519.0, DType::kFloat16), 65504.0);
  EXPECT_EQ(round_to_dtype(65520.0, DType::kFloat16), kInf);
  EXPECT_EQ(round_to_dtype(std::ldexp(1.0, -25), DType::kFloat16), 0.0);
  EXPECT_EQ(round_to_dtype(std::ldexp(3.0, -26), DType::kFloat16), std::ldexp(1.0, -24));
  EXPECT_EQ(round_to_dtype(1.0 + std::ldexp(1.0, -8), DType::kBFloat16), 1.0);
  EXPECT_EQ(round_to_dtype(1.0 + 3 * std::ldexp(1.0, -8), DType::kBFloat16),
            1.0 + std::ldexp(1.0, -6));
  EXPECT_EQ(encode_float16(1.0), 0x3c00);
  EXPECT_EQ(encode_float16(-2.0), 0xc000);
  EXPECT_EQ(encode_float16(65504.0), 0x7bff);
  EXPECT_EQ(encode_float16(std::ldexp(1.0, -24)), 0x0001);
  EXPECT_EQ(encode_float16(std::ldexp(1.0, -14)), 0x0400);
  EXPECT_EQ(encode_bfloat16(1.0), 0x3f80);
  EXPECT_EQ(encode_bfloat16(-kInf), 0xff80);
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const auto b = static_cast<uint16_t>(bits);
    const double h = decode_float16(b), bf = decode_bfloat16(b);
    if (!std::isnan(h)) {
      ASSERT_EQ(encode_float16(h), b);
    }
    if (!std::isnan(bf)) {
      ASSERT_EQ(encode_bfloat16(bf), b);
    }
  }
}

Tensor from_values(const Shape& shape, const std::vector<double>& values,
                   DType dtype = DType::kFloat64) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_from_doubles(t, values);
  return t;
}

// q = [1, 0], keys [1, 0] and [0, 1], scale 1: scores [1, 0].
TEST(ReferenceAttention, HandComputedTwoKeys) {
  const Tensor q = from_values({1, 1, 1, 2}, {1, 0});
  const Tensor k = from_values({1, 1, 2, 2}, {1, 0, 0, 1});
  const Tensor v = from_values({1, 1, 2, 2}, {1, 2, 3, 4});
  ReferenceOptions o;
  o.scale = 1.0;
  const ReferenceResult r = reference_attention(q, k, v, o);
  const double e = std::exp(1.0);
  const double p0 = e / (e + 1), p1 = 1 / (e + 1);
  EXPECT_NEAR(r.out[0], p0 * 1 + p1 * 3, 1e-15);
  EXPECT_NEAR(r.out[1], p0 * 2 + p1 * 4, 1e-15);
  EXPECT_NEAR(r.lse[0], std::log(e + 1), 1e-15);
  EXPECT_FALSE(r.fully_masked[0]);

  o.mask = from_values({2}, {0, 1}, DType::kBool);  // drop key 0
  const ReferenceResult masked = reference_attention(q, k, v, o);
  EXPECT_EQ(masked.out[0], 3.0);
  EXPECT_EQ(masked.out[1], 4.0);
  EXPECT_NEAR(masked.lse[0], 0.0, 1e-15);

  o.mask = from_values({1, 2}, {0, -kInf});  // additive: only key 0
  const ReferenceResult additive = reference_attention(q, k, v, o);
  EXPECT_EQ(additive.out[0], 1.0);
  EXPECT_NEAR(additive.lse[0], 1.0, 1e-15);

  o.mask = from_values({2}, {0, 0}, DType::kBool);  // nothing left
  const ReferenceResult none = reference_attention(q, k, v, o);
  EXPECT_TRUE(none.fully_masked[0]);
  EXPECT_EQ(none.out[0], 0.0);
  EXPECT_EQ(none.lse[0], -kInf);
}

// Causal (top-left): row 0 sees only key 0; GQA: both query heads read kv head 0.
TEST(ReferenceAttention, CausalAndGroupedHeads) {
  const Tensor q = from_values({2, 2, 1}, {1, 1, 1, 1});  // [Hq=2, L=2, E=1]
  const Tensor k = from_values({1, 3, 1}, {0, 0, 0});     // equal scores
  const Tensor v = from_values({1, 3, 1}, {1, 2, 6});
  ReferenceOptions o;
  o.causal = true;
  const ReferenceResult r = reference_attention(q, k, v, o);
  ASSERT_EQ(r.out.size(), 4u);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(r.out[h * 2 + 0], 1.0);
    EXPECT_DOUBLE_EQ(r.out[h * 2 + 1], 1.5);
    EXPECT_DOUBLE_EQ(r.lse[h * 2 + 1], std::log(2.0));
  }
}

// The harness's layouts present the same logical values whatever the memory order.
TEST(Harness, LayoutsHoldTheLogicalShapeWithTheRightStrides) {
  for (Layout l : {Layout::kBHSD, Layout::kBSHD, Layout::kSliceD, Layout::kStridedD,
                   Layout::kHeadDimMajor}) {
    std::mt19937 rng(1);
    const Tensor t = random_tensor({2, 3, 5, 4}, DType::kFloat32, l, rng);
    EXPECT_EQ(t.sizes(), (Shape{2, 3, 5, 4})) << layout_name(l);
    EXPECT_EQ(t.is_contiguous(), l == Layout::kBHSD) << layout_name(l);
    const auto values = to_doubles(t);
    for (double x : values) EXPECT_TRUE(std::isfinite(x)) << layout_name(l);
    std::mt19937 rng2(1);
    const Tensor c = random_tensor({2, 3, 5, 4}, DType::kFloat32, Layout::kBHSD, rng2);
    EXPECT_EQ(values, to_doubles(c)) << layout_name(l) << " draws different values";
  }
}

// The comparison fails when it should: a perturbed output, a NaN, a non-zero masked row.
TEST(Harness, ComparisonDetectsErrors) {
  Case c;
  c.heads_q = c.heads_kv = 1;
  c.q_len = 4;
  c.kv_len = 6;
  c.head_dim = 8;
  c.mask = MaskKind::kBool;
  c.mask_shape = {4, 6};
  c.masked_rows = {2};
  const CaseInputs in = make_inputs(c);
  Tensor out = Tensor::empty({1, 1, 4, 8}, DType::kFloat32);
  Tensor lse = Tensor::empty({1, 1, 4}, DType::kFloat32);
  fill_from_doubles(out, in.ref.out);
  fill_from_doubles(lse, in.ref.lse);
  EXPECT_TRUE(matches_reference(out, lse, in.ref, DType::kFloat32, false));
  test::set_at(out, {0, 0, 1, 3}, out.item({0, 0, 1, 3}) + 1e-3);
  EXPECT_FALSE(matches_reference(out, lse, in.ref, DType::kFloat32, false));
  fill_from_doubles(out, in.ref.out);
  test::set_at(out, {0, 0, 2, 0}, 1e-30);  // masked row must be exactly zero
  EXPECT_FALSE(matches_reference(out, lse, in.ref, DType::kFloat32, false));
  fill_from_doubles(out, in.ref.out);
  test::set_at(lse, {0, 0, 2}, -1e30);  // masked row lse must be -inf
  EXPECT_FALSE(matches_reference(out, lse, in.ref, DType::kFloat32, false));
  fill_from_doubles(lse, in.ref.lse);
  test::set_at(out, {0, 0, 0, 0}, std::nan(""));
  EXPECT_FALSE(matches_reference(out, lse, in.ref, DType::kFloat32, false));
}

}  // namespace
}  // namespace sdpa::test
