// Calls torch accepts at the edges of the domain: dropout_p = 1 (every weight dropped) and
// head_dim E = 0 (empty dot products). Checked on every CPU backend that takes them.

#include "sdpa/attn_bias.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;

TEST(Degenerate, DropoutOneGivesZerosAndZeroGradients) {
  const Tensor q = randn({2, 3, 17, 24}, DType::kFloat32, 1);
  const Tensor k = randn({2, 3, 29, 24}, DType::kFloat32, 2);
  const Tensor v = randn({2, 3, 29, 24}, DType::kFloat32, 3);
  const Tensor grad_out = randn({2, 3, 17, 24}, DType::kFloat32, 4);
  SDPAOptions undropped;
  undropped.is_causal = true;
  const FwdBwd reference = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, undropped);
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    SDPAOptions o = undropped;
    o.dropout_p = 1.0;
    const FwdBwd r = run_fwd_bwd(backend, q, k, v, grad_out, o);
    EXPECT_EQ(r.fwd.backend, backend);
    EXPECT_TRUE(all_zero(r.fwd.out));
    EXPECT_FALSE(has_nan(r.fwd.out));
    // lse is of the undropped scores, as for any dropout_p.
    EXPECT_TRUE(close_to("lse", r.fwd.lse, reference.fwd.lse, DType::kFloat32));
    EXPECT_TRUE(all_zero(r.grads.grad_q));
    EXPECT_TRUE(all_zero(r.grads.grad_k));
    EXPECT_TRUE(all_zero(r.grads.grad_v));
  }
}

TEST(Degenerate, DropoutAboveOneIsStillAnError) {
  const Tensor q = randn({1, 1, 4, 8}, DType::kFloat32, 1);
  SDPAOptions o;
  o.dropout_p = 1.5;
  EXPECT_NE(error_message([&] { sdpa::scaled_dot_product_attention(q, q, q, o); })
                .find("dropout_p: expected a probability in [0, 1], got 1.5"),
            std::string::npos);
}

TEST(Degenerate, EmptyHeadDimGivesEmptyOutputsAndUniformWeights) {
  // E = Ev = 0: out [B, H, L, 0]; every score is 0, so lse = log(visible keys).
  const Tensor q = randn({2, 3, 5, 0}, DType::kFloat32, 1);
  const Tensor kv = randn({2, 3, 7, 0}, DType::kFloat32, 2);
  SDPAOptions causal;
  causal.is_causal = true;
  const FwdBwd r = run_fwd_bwd(SDPBackend::MATH, q, kv, kv, randn({2, 3, 5, 0}, DType::kFloat32, 3),
                               causal);
  EXPECT_EQ(r.fwd.out.sizes(), (Shape{2, 3, 5, 0}));
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(r.fwd.lse.item({1, 2, i}), std::log(static_cast<double>(i + 1)), 1e-6);
  }
  EXPECT_EQ(r.grads.grad_q.sizes(), q.sizes());
  EXPECT_EQ(r.grads.grad_k.sizes(), kv.sizes());
  EXPECT_EQ(r.grads.grad_v.sizes(), kv.sizes());
  // The default selection serves it (FLASH refuses head_dim 0 with a reason).
  sdpa::Reasons reasons;
  EXPECT_FALSE(sdpa::can_use(SDPBackend::FLASH_ATTENTION, sdpa::make_params(q, kv, kv, causal),
                             &reasons));
  EXPECT_EQ(sdpa::scaled_dot_product_attention_with_lse(q, kv, kv, causal).backend,
            SDPBackend::MATH);
}

TEST(Degenerate, EmptyQueryKeyDimAveragesTheValues) {
  // E = 0, Ev = 4: uniform weights over the visible keys, so out is their mean and
  // grad_v[j] is the sum of grad_out over the rows that see key j, divided by their count.
  const Tensor q = randn({1, 2, 3, 0}, DType::kFloat64, 1);
  const Tensor k = randn({1, 2, 6, 0}, DType::kFloat64, 2);
  const Tensor v = randn({1, 2, 6, 4}, DType::kFloat64, 3);
  const Tensor grad_out = randn({1, 2, 3, 4}, DType::kFloat64, 4);
  SDPAOptions o;
  o.attn_mask = sdpa::causal_lower_right(3, 6);  // row i sees keys 0 .. i + 3
  const FwdBwd r = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, o);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t e = 0; e < 4; ++e) {
        double mean = 0.0;
        for (int64_t j = 0; j <= i + 3; ++j) mean += v.item({0, h, j, e});
        EXPECT_NEAR(r.fwd.out.item({0, h, i, e}), mean / static_cast<double>(i + 4), 1e-12);
      }
    }
    for (int64_t j = 0; j < 6; ++j) {
      for (int64_t e = 0; e < 4; ++e) {
        double expected = 0.0;
        for (int64_t i = 0; i < 3; ++i) {
          if (j <= i + 3) expected += grad_out.item({0, h, i, e}) / static_cast<double>(i + 4);
        }
        EXPECT_NEAR(r.grads.grad_v.item({0, h, j, e}), expected, 1e-12);
      }
    }
  }
}

}  // namespace
}  // namespace sdpa_test
