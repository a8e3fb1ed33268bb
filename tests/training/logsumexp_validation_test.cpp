// logsumexp (and out) of both backends vs a float64 reference written here from the
// definition, and the backward's input validation.
//
// Tolerance: lse is float32 and computed in float32 (MATH float64 inputs: in float64, then
// rounded), so |lse - ref| <= kFudge * 1e-5 * max(|ref|, 1) (attention_test_util.h); out
// in the input dtype by the same rule with the dtype's default.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using ::testing::HasSubstr;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

SDPAOptions gqa_options() {
  SDPAOptions o;
  o.enable_gqa = true;
  return o;
}

// Reference out [B, Hq, L, Ev] and lse [B, Hq, L] in float64 for 4-D inputs; `keep(b, h, i,
// j)` and `add(b, h, i, j)` give the mask.
template <typename Keep, typename Add>
std::pair<Tensor, Tensor> reference(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    double scale, Keep keep, Add add) {
  const Tensor q = f64(q_in), k = f64(k_in), v = f64(v_in);
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), E = q.size(3);
  const int64_t Hkv = k.size(1), S = k.size(2), Ev = v.size(3);
  const double* qd = q.data<double>();
  const double* kd = k.data<double>();
  const double* vd = v.data<double>();
  Tensor out = Tensor::zeros({B, Hq, L, Ev}, DType::kFloat64);
  Tensor lse = Tensor::empty({B, Hq, L}, DType::kFloat64);
  double* od = out.data<double>();
  double* ld = lse.data<double>();
  std::vector<double> s(S);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < L; ++i) {
        double m = kNegInf;
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < E; ++e) {
            dot += qd[((b * Hq + h) * L + i) * E + e] * kd[((b * Hkv + hk) * S + j) * E + e];
          }
          s[j] = keep(b, h, i, j) ? dot * scale + add(b, h, i, j) : kNegInf;
          m = std::max(m, s[j]);
        }
        const int64_t row = (b * Hq + h) * L + i;
        if (m == kNegInf) {
          ld[row] = kNegInf;
          continue;
        }
        double sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += std::exp(s[j] - m);
        ld[row] = m + std::log(sum);
        for (int64_t j = 0; j < S; ++j) {
          const double w = std::exp(s[j] - ld[row]);
          for (int64_t e = 0; e < Ev; ++e) {
            od[row * Ev + e] += w * vd[((b * Hkv + hk) * S + j) * Ev + e];
          }
        }
      }
    }
  }
  return {out, lse};
}

struct LseCase {
  std::string name;
  SDPBackend backend;
  DType dtype;
};

class Logsumexp : public ::testing::TestWithParam<LseCase> {};

TEST_P(Logsumexp, MatchesFloat64Definition) {
  const LseCase& c = GetParam();
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 70, S = 131, E = 40, Ev = 24;
  const Tensor q = randn({B, Hq, L, E}, c.dtype, 51, 2.0);  // larger scores: lse far from log S
  const Tensor k = randn({B, Hkv, S, E}, c.dtype, 52);
  const Tensor v = randn({B, Hkv, S, Ev}, c.dtype, 53);
  const double scale = 1.0 / std::sqrt(static_cast<double>(E));
  sdpa::sdpa_kernel guard(c.backend);

  {  // No mask.
    SDPAOptions o;
    o.enable_gqa = true;
    const auto r = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
    const auto ref = reference(
        q, k, v, scale, [](auto...) { return true; }, [](auto...) { return 0.0; });
    EXPECT_EQ(r.backend, c.backend);
    EXPECT_EQ(r.lse.dtype(), DType::kFloat32);
    EXPECT_EQ(r.lse.sizes(), (Shape{B, Hq, L}));
    EXPECT_TRUE(close_to("lse", r.lse, ref.second, DType::kFloat32));
    EXPECT_TRUE(close_to("out", r.out, ref.first, c.dtype));
  }
  {  // Causal (top-left) with custom scale.
    SDPAOptions o;
    o.enable_gqa = true;
    o.is_causal = true;
    o.scale = 0.3;
    const auto r = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
    const auto ref = reference(
        q, k, v, 0.3, [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; },
        [](auto...) { return 0.0; });
    EXPECT_TRUE(close_to("causal lse", r.lse, ref.second, DType::kFloat32));
    EXPECT_TRUE(close_to("causal out", r.out, ref.first, c.dtype));
  }
  {  // Bool mask with fully masked rows (lse = -inf) and an additive float mask.
    Tensor keep = random_bool({B, 1, L, S}, 0.5, 54);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < S; ++j) keep.set_item(Shape{b, 0, 3, j}, 0.0);
    }
    SDPAOptions o;
    o.enable_gqa = true;
    o.attn_mask = keep;
    const auto r = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
    const std::vector<double> kv = values(keep);
    const auto ref = reference(
        q, k, v, scale,
        [&](int64_t b, int64_t, int64_t i, int64_t j) { return kv[(b * L + i) * S + j] != 0.0; },
        [](auto...) { return 0.0; });
    EXPECT_TRUE(close_to("bool-mask lse", r.lse, ref.second, DType::kFloat32));
    EXPECT_TRUE(close_to("bool-mask out", r.out, ref.first, c.dtype));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < Hq; ++h) EXPECT_EQ(r.lse.item({b, h, 3}), kNegInf);
    }

    const Tensor add = randn({Hq, L, S}, c.dtype, 55, 3.0);
    o.attn_mask = add;
    const auto r2 = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
    const std::vector<double> av = values(add);
    const auto ref2 = reference(
        q, k, v, scale, [](auto...) { return true; },
        [&](int64_t, int64_t h, int64_t i, int64_t j) { return av[(h * L + i) * S + j]; });
    EXPECT_TRUE(close_to("float-mask lse", r2.lse, ref2.second, DType::kFloat32));
    EXPECT_TRUE(close_to("float-mask out", r2.out, ref2.first, c.dtype));
  }
  {  // 3-D inputs give 2-D lse.
    const auto r = sdpa::scaled_dot_product_attention_with_lse(q.select(0, 1), k.select(0, 1),
                                                               v.select(0, 1), gqa_options());
    EXPECT_EQ(r.lse.sizes(), (Shape{Hq, L}));
    const auto ref = reference(
        q, k, v, scale, [](auto...) { return true; }, [](auto...) { return 0.0; });
    EXPECT_TRUE(close_to("unbatched lse", r.lse, ref.second.select(0, 1), DType::kFloat32));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, Logsumexp,
    ::testing::Values(LseCase{"MathF64", SDPBackend::MATH, DType::kFloat64},
                      LseCase{"MathF32", SDPBackend::MATH, DType::kFloat32},
                      LseCase{"FlashF32", SDPBackend::FLASH_ATTENTION, DType::kFloat32},
                      LseCase{"FlashBf16", SDPBackend::FLASH_ATTENTION, DType::kBFloat16},
                      LseCase{"FlashF16", SDPBackend::FLASH_ATTENTION, DType::kFloat16}),
    [](const ::testing::TestParamInfo<LseCase>& info) { return info.param.name; });

// ---- Backward input validation. ------------------------------------------------------

class BackwardValidation : public ::testing::TestWithParam<SDPBackend> {
 protected:
  Tensor q = randn({2, 4, 9, 16}, DType::kFloat32, 61);
  Tensor k = randn({2, 2, 11, 16}, DType::kFloat32, 62);
  Tensor v = randn({2, 2, 11, 8}, DType::kFloat32, 63);
  Tensor go = randn({2, 4, 9, 8}, DType::kFloat32, 64);
  SDPAOptions options = gqa_options();
  sdpa::AttentionResult fwd;

  void SetUp() override {
    sdpa::sdpa_kernel guard(GetParam());
    fwd = sdpa::scaled_dot_product_attention_with_lse(q, k, v, options);
  }
  std::string backward_error(const Tensor& grad_out, const Tensor& out, const Tensor& lse) {
    sdpa::sdpa_kernel guard(GetParam());
    return error_message(
        [&] { sdpa::scaled_dot_product_attention_backward(grad_out, q, k, v, out, lse, options); });
  }
};

TEST_P(BackwardValidation, ValidCallRuns) {
  sdpa::sdpa_kernel guard(GetParam());
  const auto g =
      sdpa::scaled_dot_product_attention_backward(go, q, k, v, fwd.out, fwd.lse, options);
  EXPECT_EQ(g.backend, GetParam());
}

TEST_P(BackwardValidation, GradOutShapeIsNamed) {
  const std::string msg = backward_error(randn({2, 4, 9, 7}, DType::kFloat32, 1), fwd.out, fwd.lse);
  EXPECT_THAT(msg, HasSubstr("grad_out"));
  EXPECT_THAT(msg, HasSubstr("[2, 4, 9, 8]"));  // expected
  EXPECT_THAT(msg, HasSubstr("[2, 4, 9, 7]"));  // got
}

TEST_P(BackwardValidation, GradOutDtypeIsNamed) {
  const std::string msg = backward_error(go.to(DType::kFloat64), fwd.out, fwd.lse);
  EXPECT_THAT(msg, HasSubstr("grad_out"));
  EXPECT_THAT(msg, HasSubstr("float64"));
}

TEST_P(BackwardValidation, UndefinedGradOutIsNamed) {
  EXPECT_THAT(backward_error(Tensor(), fwd.out, fwd.lse), HasSubstr("grad_out"));
}

TEST_P(BackwardValidation, OutShapeIsNamed) {
  const std::string msg = backward_error(go, fwd.out.slice(2, 0, 8), fwd.lse);
  EXPECT_THAT(msg, HasSubstr("out"));
  EXPECT_THAT(msg, ::testing::Not(HasSubstr("grad_out")));
}

TEST_P(BackwardValidation, LseShapeIsNamed) {
  const std::string msg = backward_error(go, fwd.out, fwd.lse.slice(1, 0, 2));
  EXPECT_THAT(msg, HasSubstr("lse"));
  EXPECT_THAT(msg, HasSubstr("[2, 4, 9]"));
}

TEST_P(BackwardValidation, LseDtypeIsNamed) {
  const std::string msg = backward_error(go, fwd.out, fwd.lse.to(DType::kFloat64));
  EXPECT_THAT(msg, HasSubstr("lse"));
  EXPECT_THAT(msg, HasSubstr("float32"));
}

TEST_P(BackwardValidation, LseWithLastDimIsNamed) {
  const std::string msg = backward_error(go, fwd.out, fwd.lse.unsqueeze(-1));
  EXPECT_THAT(msg, HasSubstr("lse"));
}

TEST_P(BackwardValidation, MaskGradWithoutFloatMaskIsNamed) {
  SDPAOptions o = options;
  o.attn_mask_requires_grad = true;
  sdpa::sdpa_kernel guard(GetParam());
  EXPECT_THAT(error_message([&] {
                sdpa::scaled_dot_product_attention_backward(go, q, k, v, fwd.out, fwd.lse, o);
              }),
              HasSubstr("attn_mask_requires_grad"));
}

INSTANTIATE_TEST_SUITE_P(Backends, BackwardValidation,
                         ::testing::Values(SDPBackend::MATH, SDPBackend::FLASH_ATTENTION),
                         [](const ::testing::TestParamInfo<SDPBackend>& info) {
                           return std::string(sdpa::backend_name(info.param));
                         });

TEST(BackwardMaskGradient, SelectsMathAndFlashOnlyGuardExplains) {
  // Only MATH computes grad_attn_mask (docs/semantics.md): with FLASH alone the call fails
  // with FLASH's reason.
  const Tensor q = randn({1, 2, 5, 8}, DType::kFloat32, 1);
  const Tensor mask = randn({5, 5}, DType::kFloat32, 2);
  SDPAOptions o;
  o.attn_mask = mask;
  const auto fwd = sdpa::scaled_dot_product_attention_with_lse(q, q, q, o);
  o.attn_mask_requires_grad = true;
  const auto g = sdpa::scaled_dot_product_attention_backward(q, q, q, q, fwd.out, fwd.lse, o);
  EXPECT_EQ(g.backend, SDPBackend::MATH);
  EXPECT_EQ(g.grad_attn_mask.sizes(), (Shape{5, 5}));
  sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  EXPECT_THAT(error_message([&] {
                sdpa::scaled_dot_product_attention_backward(q, q, q, q, fwd.out, fwd.lse, o);
              }),
              HasSubstr("grad"));
}

}  // namespace
}  // namespace sdpa_test
