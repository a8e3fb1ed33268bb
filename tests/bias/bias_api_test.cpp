// The AttnBias API: invalid parameters give clear sdpa::Errors, user-defined biases
// (materialize() only) run on every backend, explain() reports native vs materialized
// handling, and the ALiBi slopes follow Press et al. (2022).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bias_reference.h"

namespace sdpa_test {
namespace {

using sdpa::AlibiBias;
using sdpa::AttnBias;
using sdpa::AttnBiasPtr;
using sdpa::BlockDiagonalBias;
using sdpa::LocalAttentionBias;
using sdpa::PaddedKeysBias;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// ---- Invalid parameters. -------------------------------------------------------------

TEST(BiasErrors, ConstructorsRejectInvalidParameters) {
  EXPECT_THAT(error_message([] { (void)LocalAttentionBias(-1, 0); }),
              AllOf(HasSubstr("LocalAttentionBias"), HasSubstr("left"), HasSubstr("-1")));
  EXPECT_THAT(error_message([] { (void)LocalAttentionBias(0, -3); }),
              AllOf(HasSubstr("LocalAttentionBias"), HasSubstr("right"), HasSubstr("-3")));
  EXPECT_THAT(error_message([] {
                (void)BlockDiagonalBias({1, 3});
              }),
              AllOf(HasSubstr("cu_seqlens_q"), HasSubstr("0"), HasSubstr("1")));
  EXPECT_THAT(error_message([] {
                (void)BlockDiagonalBias({0, 3}, {2, 3});
              }),
              HasSubstr("cu_seqlens_kv"));
  EXPECT_THAT(error_message([] {
                (void)BlockDiagonalBias({0, 3, 2});
              }),
              AllOf(HasSubstr("cu_seqlens_q"), HasSubstr("non-decreasing"), HasSubstr("3"),
                    HasSubstr("2")));
  EXPECT_THAT(error_message([] {
                (void)BlockDiagonalBias({0, 3, 5}, {0, 5});
              }),
              HasSubstr("documents"));
  EXPECT_THAT(error_message([] { (void)BlockDiagonalBias({0}); }), HasSubstr("cu_seqlens_q"));
  EXPECT_THAT(error_message([] { BlockDiagonalBias::from_seqlens({2, -1}); }), HasSubstr("-1"));
  EXPECT_THAT(error_message([] { (void)AlibiBias(std::vector<float>{}); }), HasSubstr("slope"));
  EXPECT_THAT(error_message([] {
                (void)AlibiBias(std::vector<float>{0.5f, std::numeric_limits<float>::quiet_NaN()});
              }),
              HasSubstr("finite"));
  EXPECT_THAT(error_message([] { (void)AlibiBias(0); }), HasSubstr("num_heads"));
  // Past kMaxAlibiHeads: a 2^40-entry slope table (bad_alloc) and, from 2^62, a
  // power-of-two search that overflowed and never ended.
  for (int64_t heads : {sdpa::kMaxAlibiHeads + 1, int64_t{1} << 40, int64_t{1} << 62,
                        std::numeric_limits<int64_t>::max()}) {
    EXPECT_THAT(error_message([heads] { (void)AlibiBias(heads); }),
                HasSubstr("AlibiBias: expected num_heads in [1, 1048576], got " +
                          std::to_string(heads)));
  }
  EXPECT_EQ(sdpa::alibi_slopes(sdpa::kMaxAlibiHeads).size(),
            static_cast<size_t>(sdpa::kMaxAlibiHeads));
  EXPECT_THAT(error_message([] {
                (void)PaddedKeysBias({3, -2});
              }),
              AllOf(HasSubstr("PaddedKeysBias"), HasSubstr("-2")));
  EXPECT_THAT(error_message([] { (void)PaddedKeysBias(std::vector<int64_t>{}); }),
              HasSubstr("PaddedKeysBias"));
  EXPECT_THAT(error_message([] { sdpa::causal_lower_right(-1, 4); }), HasSubstr("CausalBias"));
  EXPECT_THAT(error_message([] { sdpa::compose({}); }), HasSubstr("ComposedBias"));
  EXPECT_THAT(error_message([] { sdpa::compose({nullptr}); }), HasSubstr("null"));
}

// A call of shape [B, Hq, L, E] x [B, Hkv, S, E] with `bias`; returns the error message.
std::string call_error(const AttnBiasPtr& bias, int64_t B, int64_t Hq, int64_t L, int64_t S,
                       SDPBackend backend, bool is_causal = false) {
  const Tensor q = randn({B, Hq, L, 8}, DType::kFloat32, 1);
  const Tensor k = randn({B, Hq, S, 8}, DType::kFloat32, 2);
  SDPAOptions o;
  o.attn_mask = bias;
  o.is_causal = is_causal;
  sdpa::sdpa_kernel guard(backend);
  return error_message([&] { sdpa::scaled_dot_product_attention(q, k, k, o); });
}

class BiasCallErrors : public ::testing::TestWithParam<SDPBackend> {};

TEST_P(BiasCallErrors, BiasesThatDoNotFitTheCallAreRejected) {
  const SDPBackend b = GetParam();
  // Documents covering 7 query / 9 key positions on an L = 8, S = 9 call, and the reverse.
  EXPECT_THAT(call_error(BlockDiagonalBias::from_seqlens({3, 4}, {4, 5}), 1, 2, 8, 9, b),
              AllOf(HasSubstr("BlockDiagonalBias"), HasSubstr("7"), HasSubstr("L=8")));
  EXPECT_THAT(call_error(BlockDiagonalBias::from_seqlens({3, 5}, {4, 4}), 1, 2, 8, 9, b),
              AllOf(HasSubstr("BlockDiagonalBias"), HasSubstr("8"), HasSubstr("S=9")));
  EXPECT_THAT(
      call_error(std::make_shared<AlibiBias>(std::vector<float>{0.5f, 0.25f}), 1, 3, 4, 4, b),
      AllOf(HasSubstr("AlibiBias"), HasSubstr("2 slopes"), HasSubstr("3")));
  EXPECT_THAT(
      call_error(std::make_shared<PaddedKeysBias>(std::vector<int64_t>{4, 4, 4}), 2, 2, 4, 4, b),
      AllOf(HasSubstr("PaddedKeysBias"), HasSubstr("3"), HasSubstr("batch 2")));
  EXPECT_THAT(
      call_error(std::make_shared<PaddedKeysBias>(std::vector<int64_t>{4, 5}), 2, 2, 4, 4, b),
      AllOf(HasSubstr("PaddedKeysBias"), HasSubstr("5"), HasSubstr("S=4")));
  EXPECT_THAT(call_error(sdpa::causal_lower_right(5, 4), 1, 2, 4, 4, b),
              AllOf(HasSubstr("CausalBias"), HasSubstr("L=5"), HasSubstr("L=4")));
  EXPECT_THAT(
      call_error(sdpa::compose({std::make_shared<AlibiBias>(2), std::make_shared<AlibiBias>(2)}), 1,
                 2, 4, 4, b),
      HasSubstr("at most one AlibiBias"));
}

TEST_P(BiasCallErrors, IsCausalTogetherWithABiasThrows) {
  const SDPBackend b = GetParam();
  EXPECT_THAT(call_error(sdpa::causal_lower_right(4, 4), 1, 2, 4, 4, b, true),
              AllOf(HasSubstr("is_causal"), HasSubstr("causal lower-right")));
  EXPECT_THAT(call_error(sdpa::causal_upper_left(4, 4), 1, 2, 4, 4, b, true),
              HasSubstr("is_causal"));
  EXPECT_THAT(call_error(std::make_shared<LocalAttentionBias>(2, 0), 1, 2, 4, 4, b, true),
              HasSubstr("is_causal"));
}

INSTANTIATE_TEST_SUITE_P(Backends, BiasCallErrors,
                         ::testing::Values(SDPBackend::MATH, SDPBackend::FLASH_ATTENTION),
                         [](const ::testing::TestParamInfo<SDPBackend>& info) {
                           return std::string(sdpa::backend_name(info.param));
                         });

// ---- User-defined biases. ------------------------------------------------------------

// Implements only materialize() and describe(): keys with (i + 2 j) % 3 == 0 are masked,
// the others get 0.1 * (h + 1) * cos(i - j) added. Float [1, Hq, L, S] of the call dtype.
class StripedBias : public AttnBias {
 public:
  Tensor materialize(const BiasShape& s, DType dtype) const override {
    ++calls;
    Tensor t = Tensor::empty({1, s.num_heads_q, s.q_len, s.kv_len}, dtype);
    for_each_index(t.sizes(), [&](const Shape& x) {
      const int64_t h = x[1], i = x[2], j = x[3];
      t.set_item(x, (i + 2 * j) % 3 == 0
                        ? kNegInf
                        : 0.1 * static_cast<double>(h + 1) * std::cos(static_cast<double>(i - j)));
    });
    return t;
  }
  std::string describe() const override { return "striped (user)"; }
  mutable int calls = 0;
};

// A user bias giving a bool mask: keys j <= 2 i only.
class BoolUserBias : public AttnBias {
 public:
  Tensor materialize(const BiasShape& s, DType) const override {
    Tensor t = Tensor::empty({s.q_len, s.kv_len}, DType::kBool);
    for_each_index(t.sizes(), [&](const Shape& x) { t.set_item(x, x[1] <= 2 * x[0] ? 1 : 0); });
    return t;
  }
  std::string describe() const override { return "two-to-one (user)"; }
};

class UserBias : public ::testing::TestWithParam<SDPBackend> {};

void expect_runs_like_its_materialization(SDPBackend backend, const AttnBiasPtr& bias, int64_t B,
                                          int64_t Hq, int64_t Hkv, int64_t L, int64_t S,
                                          DType dtype) {
  const Tensor q = randn({B, Hq, L, 24}, dtype, 81);
  const Tensor k = randn({B, Hkv, S, 24}, dtype, 82);
  const Tensor v = randn({B, Hkv, S, 16}, dtype, 83);
  const Tensor go = randn({B, Hq, L, 16}, dtype, 84);
  SDPAOptions o;
  o.enable_gqa = Hq != Hkv;
  o.attn_mask = bias;
  SDPAOptions dense = o;
  dense.attn_mask = bias->materialize({B, Hq, L, S}, DType::kFloat64);
  const FwdBwd golden = run_fwd_bwd(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(go), dense);
  const FwdBwd naive = run_fwd_bwd(SDPBackend::MATH, q, k, v, go, o);
  const FwdBwd r = run_fwd_bwd(backend, q, k, v, go, o);
  EXPECT_EQ(r.fwd.backend, backend);
  EXPECT_EQ(r.grads.backend, backend);
  expect_matches_golden(r, golden, naive, dtype);
}

TEST_P(UserBias, MaterializeOnlyBiasRunsOnEveryBackend) {
  const auto striped = std::make_shared<StripedBias>();
  EXPECT_TRUE(striped->needs_materialization());
  expect_runs_like_its_materialization(GetParam(), striped, 2, 4, 2, 70, 131, DType::kFloat32);
  EXPECT_GT(striped->calls, 0);
  expect_runs_like_its_materialization(GetParam(), std::make_shared<BoolUserBias>(), 1, 2, 2, 65,
                                       100, DType::kFloat32);
  if (GetParam() == SDPBackend::FLASH_ATTENTION) {
    expect_runs_like_its_materialization(GetParam(), striped, 1, 2, 1, 65, 66, DType::kBFloat16);
  }
}

TEST_P(UserBias, CompositionWithAUserBiasFallsBackToMaterialization) {
  const int64_t B = 2, Hq = 4, L = 70, S = 90;
  const auto striped = std::make_shared<StripedBias>();
  const auto composed =
      sdpa::compose({striped, sdpa::causal_lower_right(L, S), std::make_shared<AlibiBias>(Hq),
                     std::make_shared<PaddedKeysBias>(std::vector<int64_t>{90, 50})});
  EXPECT_TRUE(composed->needs_materialization());
  expect_runs_like_its_materialization(GetParam(), composed, B, Hq, 2, L, S, DType::kFloat32);
  // The composition's materialization is the intersection/sum of its parts'.
  const std::vector<float> slopes_f = sdpa::alibi_slopes(Hq);
  const std::vector<double> slopes(slopes_f.begin(), slopes_f.end());
  EXPECT_TRUE(materializes_as(
      *composed, {B, Hq, L, S},
      expect_all({expect_tensor(striped->materialize({B, Hq, L, S}, DType::kFloat64)),
                  expect_causal(DiagonalAlignment::kBottomRight, {B, Hq, L, S}),
                  expect_alibi(slopes, DiagonalAlignment::kBottomRight, {B, Hq, L, S}),
                  expect_padded({90, 50}, false, {B, Hq, L, S})})));
}

INSTANTIATE_TEST_SUITE_P(Backends, UserBias,
                         ::testing::Values(SDPBackend::MATH, SDPBackend::FLASH_ATTENTION),
                         [](const ::testing::TestParamInfo<SDPBackend>& info) {
                           return std::string(sdpa::backend_name(info.param));
                         });

TEST(UserBiasComposition, MisfitPartsAreRejectedEvenWhenTheCompositionIsMaterialized) {
  // A composition with a user part is materialized as a whole; its provided parts must
  // still be checked against the call like when they are lowered natively.
  const auto striped = std::make_shared<StripedBias>();
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    EXPECT_THAT(call_error(sdpa::compose({striped, BlockDiagonalBias::from_seqlens({3, 4})}), 1, 2,
                           8, 8, b),
                HasSubstr("BlockDiagonalBias"))
        << sdpa::backend_name(b);
    EXPECT_THAT(call_error(sdpa::compose({striped, sdpa::causal_lower_right(5, 4)}), 1, 2, 4, 4, b),
                HasSubstr("CausalBias"))
        << sdpa::backend_name(b);
    EXPECT_THAT(
        call_error(
            sdpa::compose({striped, std::make_shared<PaddedKeysBias>(std::vector<int64_t>{9})}), 1,
            2, 4, 4, b),
        HasSubstr("PaddedKeysBias"))
        << sdpa::backend_name(b);
  }
}

// ---- explain(). ----------------------------------------------------------------------

// The lines of `text` from the one starting with `backend` up to the next backend line.
std::string backend_block(const std::string& text, const std::string& backend) {
  const size_t start = text.find("\n" + backend);
  if (start == std::string::npos) return "";
  size_t end = start + 1;
  while (true) {
    end = text.find('\n', end);
    if (end == std::string::npos || end + 1 >= text.size() || text[end + 1] != ' ') break;
    ++end;
  }
  return text.substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1);
}

TEST(BiasExplain, NativeOnFlashMaterializedOnMath) {
  const Tensor q = randn({1, 4, 8, 16}, DType::kFloat32, 1);
  SDPAOptions o;
  o.attn_mask = sdpa::compose({sdpa::causal_lower_right(8, 8), std::make_shared<AlibiBias>(4)});
  const sdpa::Explanation e = sdpa::explain(sdpa::make_params(q, q, q, o));
  EXPECT_EQ(e.chosen, SDPBackend::FLASH_ATTENTION);
  const std::string text = e.to_string();
  const std::string flash = backend_block(text, "FLASH_ATTENTION");
  const std::string math = backend_block(text, "MATH");
  EXPECT_THAT(flash, AllOf(HasSubstr("attn_mask: native"), HasSubstr("causal lower-right"),
                           HasSubstr("ALiBi")))
      << text;
  EXPECT_THAT(math, HasSubstr("attn_mask: materialized")) << text;
  for (const sdpa::BackendVerdict& v : e.verdicts) {
    if (v.backend == SDPBackend::FLASH_ATTENTION) {
      EXPECT_THAT(v.bias_handling, HasSubstr("native"));
    }
    if (v.backend == SDPBackend::MATH) {
      EXPECT_THAT(v.bias_handling, HasSubstr("materialized"));
    }
  }
}

TEST(BiasExplain, UserBiasIsMaterializedEverywhere) {
  const Tensor q = randn({1, 2, 8, 16}, DType::kFloat32, 1);
  SDPAOptions o;
  o.attn_mask = sdpa::compose({std::make_shared<StripedBias>(), sdpa::causal_upper_left(8, 8)});
  const sdpa::Explanation e = sdpa::explain(sdpa::make_params(q, q, q, o));
  const std::string text = e.to_string();
  EXPECT_THAT(backend_block(text, "FLASH_ATTENTION"),
              AllOf(HasSubstr("materialized"), HasSubstr("striped (user)")))
      << text;
  EXPECT_THAT(backend_block(text, "FLASH_ATTENTION"), ::testing::Not(HasSubstr("native"))) << text;
  EXPECT_THAT(backend_block(text, "MATH"), HasSubstr("materialized")) << text;
}

TEST(BiasExplain, NoMaskReportsNoBiasHandling) {
  const Tensor q = randn({1, 2, 8, 16}, DType::kFloat32, 1);
  for (const sdpa::BackendVerdict& v : sdpa::explain(sdpa::make_params(q, q, q)).verdicts) {
    EXPECT_EQ(v.bias_handling, "");
  }
}

// ---- ALiBi slopes. -------------------------------------------------------------------

TEST(AlibiSlopes, EightHeadsArePowersOfOneHalf) {
  const std::vector<float> s = sdpa::alibi_slopes(8);
  ASSERT_EQ(s.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(s[h], std::ldexp(1.0f, -(h + 1))) << h;
  EXPECT_EQ(AlibiBias(8).slopes(), s);
}

TEST(AlibiSlopes, PowersOfTwoFollowTheGeometricRecipe) {
  // n heads (a power of two): slope_h = 2^(-8 (h + 1) / n).
  for (int n : {1, 2, 4, 16}) {
    const std::vector<float> s = sdpa::alibi_slopes(n);
    ASSERT_EQ(static_cast<int>(s.size()), n);
    for (int h = 0; h < n; ++h) {
      EXPECT_FLOAT_EQ(s[h], static_cast<float>(std::exp2(-8.0 * (h + 1) / n))) << n << " " << h;
    }
  }
}

TEST(AlibiSlopes, TwelveHeadsInterpolateAsInThePaper) {
  // Press et al.'s get_slopes(12): get_slopes_power_of_2(8) + get_slopes(16)[0::2][:4],
  // i.e. 2^-1 .. 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  std::vector<double> expected;
  for (int h = 1; h <= 8; ++h) expected.push_back(std::exp2(-h));
  for (double e : {0.5, 1.5, 2.5, 3.5}) expected.push_back(std::exp2(-e));
  const std::vector<float> s = sdpa::alibi_slopes(12);
  ASSERT_EQ(s.size(), expected.size());
  for (size_t h = 0; h < s.size(); ++h) {
    EXPECT_FLOAT_EQ(s[h], static_cast<float>(expected[h])) << h;
  }
}

TEST(AlibiSlopes, MaterializedValuesAreMinusSlopeTimesDistance) {
  const AlibiBias br(std::vector<float>{0.5f, 0.125f});
  const AlibiBias tl(std::vector<float>{0.5f, 0.125f}, DiagonalAlignment::kTopLeft);
  const BiasShape shape{1, 2, 3, 5};
  const Tensor m_br = br.materialize(shape, DType::kFloat64).expand(shape.scores());
  const Tensor m_tl = tl.materialize(shape, DType::kFloat64).expand(shape.scores());
  const double slopes[2] = {0.5, 0.125};
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 5; ++j) {
        EXPECT_DOUBLE_EQ(m_br.item({0, h, i, j}), -slopes[h] * std::abs(double(i + 2 - j)));
        EXPECT_DOUBLE_EQ(m_tl.item({0, h, i, j}), -slopes[h] * std::abs(double(i - j)));
      }
    }
  }
}

}  // namespace
}  // namespace sdpa_test
