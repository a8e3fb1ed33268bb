// flex_attention_max_scores (torch 2.15's AuxRequest(max_scores=True)) against a float64
// maximum computed here from the same inputs: soft-capping score_mod, a causal BlockMask,
// a boolean attn_mask with fully masked rows, GQA, odd sizes, L != S, a non-contiguous
// query, float32 / bfloat16 / float64; and its consistency with flex_attention's lse.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "flex_test_util.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::flex::BlockMask;
using sdpa::flex::Program;
namespace mods = sdpa::flex::mods;

constexpr double kCap = 4.0;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct MaxCase {
  int64_t B, Hq, Hkv, L, S, E, block;
  DType dtype;
  bool transposed_q;
};

// Key j is kept for query i by the causal BlockMask (j <= i) and by `keep` [L, S].
Tensor reference_max(const Tensor& q, const Tensor& k, const std::vector<bool>& keep) {
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), E = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2);
  const Tensor q64 = to64(q).contiguous(), k64 = to64(k).contiguous();
  const double* qd = q64.data<double>();
  const double* kd = k64.data<double>();
  Tensor out = Tensor::empty({B, Hq, L}, DType::kFloat64);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < L; ++i) {
        double best = -kInf;
        for (int64_t j = 0; j < S; ++j) {
          if (j > i || !keep[i * S + j]) continue;
          double dot = 0.0;
          for (int64_t e = 0; e < E; ++e) {
            dot += qd[((b * Hq + h) * L + i) * E + e] * kd[((b * Hkv + hk) * S + j) * E + e];
          }
          best = std::max(best, kCap * std::tanh(dot / std::sqrt(static_cast<double>(E)) / kCap));
        }
        out.data<double>()[(b * Hq + h) * L + i] = best;
      }
    }
  }
  return out;
}

class MaxScores : public ::testing::TestWithParam<MaxCase> {};

TEST_P(MaxScores, MatchAFloat64ReferenceAndBoundTheLse) {
  const MaxCase c = GetParam();
  Tensor q = randn({c.B, c.Hq, c.L, c.E}, c.dtype, 1, 2.0);
  if (c.transposed_q) {
    q = randn({c.B, c.L, c.Hq, c.E}, c.dtype, 1, 2.0).transpose(1, 2);
  }
  const Tensor k = randn({c.B, c.Hkv, c.S, c.E}, c.dtype, 2, 2.0);
  const Tensor v = randn({c.B, c.Hkv, c.S, 5}, c.dtype, 3);
  // Random keep pattern with row 2 (when there is one) hiding every key.
  std::vector<bool> keep(static_cast<size_t>(c.L * c.S));
  Tensor mask = Tensor::empty({c.L, c.S}, DType::kBool);
  for (int64_t i = 0; i < c.L; ++i) {
    for (int64_t j = 0; j < c.S; ++j) {
      const bool kept = i != 2 && (i * 7 + j * 3) % 5 != 0;
      keep[i * c.S + j] = kept;
      mask.set_item(Shape{i, j}, kept ? 1.0 : 0.0);
    }
  }
  SDPAOptions o;
  o.attn_mask = mask;
  o.enable_gqa = c.Hq != c.Hkv;
  const Program cap = Program::from_score_mod(mods::soft_cap(kCap));
  const BlockMask blocks =
      sdpa::flex::create_block_mask(mods::causal(), 1, 1, c.L, c.S, c.block);

  const Tensor max_scores = sdpa::flex_attention_max_scores(q, k, v, cap, &blocks, o);
  ASSERT_EQ(max_scores.dtype(), DType::kFloat32);
  const Tensor golden = reference_max(q, k, keep);
  // Scores in float32 (float64 for float64 inputs: one float32 rounding of the result)
  // from the same rounded inputs.
  const Tolerance tol = c.dtype == DType::kFloat64 ? Tolerance{1e-9, 1.2e-7}
                                                  : Tolerance{4 * default_atol(DType::kFloat32),
                                                              4 * default_rtol(DType::kFloat32)};
  EXPECT_TRUE(all_close(max_scores, golden, tol, "max_scores"));
  if (c.L > 2) {
    EXPECT_EQ(max_scores.item({0, 0, 2}), -kInf);
  }

  // lse = max + log(sum of exp(s - max)), the sum between 1 and the row's kept keys.
  const sdpa::AttentionResult r = sdpa::flex_attention(q, k, v, cap, &blocks, o);
  const std::vector<double> m = values(max_scores), lse = values(r.lse);
  for (size_t row = 0; row < m.size(); ++row) {
    if (std::isinf(m[row])) {
      EXPECT_EQ(lse[row], -kInf);
      continue;
    }
    EXPECT_GE(lse[row], m[row] - 1e-5);
    EXPECT_LE(lse[row], m[row] + std::log(static_cast<double>(c.S)) + 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MaxScores,
    ::testing::Values(MaxCase{2, 4, 2, 65, 257, 33, 64, DType::kFloat32, false},
                      MaxCase{1, 2, 2, 7, 63, 17, 16, DType::kFloat32, true},
                      MaxCase{1, 3, 1, 257, 7, 8, 128, DType::kBFloat16, false},
                      MaxCase{2, 2, 1, 63, 65, 24, 16, DType::kFloat64, true},
                      MaxCase{1, 1, 1, 1, 1, 3, 16, DType::kFloat32, false}));

TEST(MaxScoresEdges, EmptyKeysGiveMinusInfinityAndBadShapesAreErrors) {
  const Tensor q = randn({1, 2, 5, 8}, DType::kFloat32, 1);
  const Tensor none = randn({1, 2, 0, 8}, DType::kFloat32, 2);
  for (double x : values(sdpa::flex_attention_max_scores(q, none, none))) EXPECT_EQ(x, -kInf);
  const Tensor unbatched = sdpa::flex_attention_max_scores(q.squeeze(0), q.squeeze(0), q.squeeze(0));
  EXPECT_EQ(unbatched.sizes(), (Shape{2, 5}));
  const Tensor k = randn({1, 2, 6, 8}, DType::kFloat32, 3);
  const Tensor v = randn({1, 2, 7, 8}, DType::kFloat32, 4);
  EXPECT_THROW(sdpa::flex_attention_max_scores(q, k, v), sdpa::Error);
}

}  // namespace
}  // namespace flex_test
