// The rounding, trigonometric and integer bit operations (floor, ceil, sin, cos, &, |, ^,
// ~, <<, >> on ints) in score_mods and mask_mods: FLASH float32 and MATH float64 against
// a float64 reference written here, forward and backward, on odd sizes with GQA; the
// integer semantics at the edges (negative operands, shift counts outside [0, 63]).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "flash_check.h"
#include "flex/eval_scalar.h"

namespace flex_test {
namespace {

using sdpa::flex::Expr;
using sdpa::flex::MaskMod;
using sdpa::flex::ScoreMod;

TEST(FlexOps, TrigonometricScoreModMatchesTheReference) {
  // score + 0.5 sin(0.375 q - 0.125 kv) cos(score): both the score path (cos) and an
  // index phase (sin) of the kind rotary-style biases use.
  const ScoreMod mod = [](const Expr& s, const Expr&, const Expr&, const Expr& q,
                          const Expr& kv) {
    return s + 0.5 * sdpa::flex::sin(q * 0.375 - kv * 0.125) * sdpa::flex::cos(s);
  };
  const Inputs in = inputs(2, 4, 2, 65, 77, 24, 8, 300);
  const double scale = 1.0 / std::sqrt(24.0);
  RefMods m;
  auto phase = [](int64_t i, int64_t j) { return std::sin(0.375 * i - 0.125 * j); };
  m.score = [&](double s, int64_t, int64_t, int64_t i, int64_t j) {
    return s + 0.5 * phase(i, j) * std::cos(s);
  };
  m.dscore = [&](double s, int64_t, int64_t, int64_t i, int64_t j) {
    return 1.0 - 0.5 * phase(i, j) * std::sin(s);
  };
  SDPAOptions opts;
  opts.enable_gqa = true;
  const Program sm = Program::from_score_mod(mod);
  check_flash_against(in, sm, nullptr, opts, reference_forward(in.q, in.k, in.v, scale, m),
                      reference_backward(in.dout, in.q, in.k, in.v, scale, m));
}

TEST(FlexOps, RoundingAndBitMasksMatchTheReference) {
  // Offsets that step with floor / ceil (exact dyadic products, so float32 and float64
  // round alike) and a mask built from integer bit operations.
  const ScoreMod mod = [](const Expr& s, const Expr&, const Expr&, const Expr& q,
                          const Expr& kv) {
    return s - 0.25 * sdpa::flex::floor(kv / 8) + 0.125 * sdpa::flex::ceil(q * 0.375);
  };
  const MaskMod mask = [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    const Expr striped = ((q ^ kv) & 3) != 3;
    const Expr near = (kv >> 1) <= q + 5;
    const Expr even_before = ((~kv & 1) == 1) & ((q << 1) >= kv);
    return (striped & near) | even_before;
  };
  auto keep = [](int64_t i, int64_t j) {
    return ((((i ^ j) & 3) != 3) && ((j >> 1) <= i + 5)) || (((~j & 1) == 1) && (i * 2 >= j));
  };
  const int64_t B = 1, Hq = 3, Hkv = 1, L = 63, S = 130;
  const Inputs in = inputs(B, Hq, Hkv, L, S, 17, 9, 400);
  const double scale = 1.0 / std::sqrt(17.0);
  RefMods m;
  m.score = [](double s, int64_t, int64_t, int64_t i, int64_t j) {
    return s - 0.25 * std::floor(j / 8.0) + 0.125 * std::ceil(i * 0.375);
  };
  m.dscore = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
  m.keep = [&](int64_t, int64_t, int64_t i, int64_t j) { return keep(i, j); };
  SDPAOptions opts;
  opts.enable_gqa = true;
  const Program sm = Program::from_score_mod(mod);
  for (int64_t block : {16, 64}) {
    SCOPED_TRACE("block " + std::to_string(block));
    const BlockMask bm = sdpa::flex::create_block_mask(mask, B, Hq, L, S, block);
    check_flash_against(in, sm, &bm, opts, reference_forward(in.q, in.k, in.v, scale, m),
                        reference_backward(in.dout, in.q, in.k, in.v, scale, m));
  }
}

TEST(FlexOps, IntegerEdgesFollowTorch) {
  using sdpa::flex::shift_left_int;
  using sdpa::flex::shift_right_int;
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  // torch / numpy: counts outside [0, 63] give 0 for << and the sign fill for >>.
  EXPECT_EQ(shift_left_int(5, 64), 0);
  EXPECT_EQ(shift_left_int(-5, -1), 0);
  EXPECT_EQ(shift_right_int(-5, 64), -1);
  EXPECT_EQ(shift_right_int(5, 65), 0);
  EXPECT_EQ(shift_right_int(-5, 1), -3);  // arithmetic: floor(-5 / 2)
  EXPECT_EQ(shift_left_int(1, 63), kMin);
  EXPECT_EQ(shift_left_int(-1, 63), kMin);
  // Through both evaluators: a score_mod adding (kv_idx - 70) >> 2 and ~q_idx & 5.
  const ScoreMod mod = [](const Expr& s, const Expr&, const Expr&, const Expr& q,
                          const Expr& kv) {
    return s + sdpa::flex::to_float((kv - 70) >> 2) + sdpa::flex::to_float(~q & 5);
  };
  const Inputs in = inputs(1, 2, 2, 7, 65, 8, 8, 500);
  RefMods m;
  m.score = [](double s, int64_t, int64_t, int64_t i, int64_t j) {
    return s + std::floor((j - 70) / 4.0) + static_cast<double>(~i & 5);
  };
  m.dscore = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
  const Program sm = Program::from_score_mod(mod);
  check_flash_against(in, sm, nullptr, {}, reference_forward(in.q, in.k, in.v, 1.0 / std::sqrt(8.0), m),
                      reference_backward(in.dout, in.q, in.k, in.v, 1.0 / std::sqrt(8.0), m));
}

}  // namespace
}  // namespace flex_test
