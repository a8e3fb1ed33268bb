// Float64 central finite-difference checks of the MATH backward: for the scalar loss
// l = sum(out * grad_out), dl/dx_i ~ (l(x + h e_i) - l(x - h e_i)) / 2h for every element
// of q, k, v and (when it requires grad) the float attn_mask.
//
// Tolerance: with h = 1e-6 the truncation error is O(h^2 |l'''|) ~ 1e-12 and the rounding
// error ~ eps * |l| / h ~ 1e-10 for the O(1) losses here, so |fd - analytic| must be below
// kAbsTol + kRelTol * |analytic| with kAbsTol = 1e-7, kRelTol = 1e-6: three orders above
// the expected error, three below the O(1e-1) gradients a wrong formula gives.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;

constexpr double kStep = 1e-6;
constexpr double kAbsTol = 1e-7;
constexpr double kRelTol = 1e-6;

// sum(out * grad_out) in float64 through MATH.
double loss(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
            const SDPAOptions& options) {
  sdpa::sdpa_kernel guard(SDPBackend::MATH);
  const Tensor out = sdpa::scaled_dot_product_attention(q, k, v, options);
  const std::vector<double> o = values(out), g = values(grad_out);
  double s = 0.0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * g[i];
  return s;
}

// Compares `analytic` (shaped like `x`) with central differences of `f` in every element
// of the contiguous float64 tensor `x` (perturbed in place and restored).
void expect_gradient(const std::string& name, Tensor x, const Tensor& analytic,
                     const std::function<double()>& f, bool require_nonzero = true) {
  ASSERT_EQ(x.dtype(), DType::kFloat64);
  ASSERT_TRUE(x.is_contiguous());
  ASSERT_EQ(analytic.sizes(), x.sizes()) << name;
  const std::vector<double> a = values(analytic);
  double* data = x.data<double>();
  int failures = 0;
  double largest = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = data[i];
    data[i] = saved + kStep;
    const double up = f();
    data[i] = saved - kStep;
    const double down = f();
    data[i] = saved;
    // A -inf mask entry stays -inf under perturbation: the loss does not depend on it.
    const double fd = std::isinf(saved) ? 0.0 : (up - down) / (2 * kStep);
    largest = std::max(largest, std::abs(a[i]));
    EXPECT_FALSE(std::isnan(a[i])) << name << "[" << i << "] is NaN";
    if (std::abs(fd - a[i]) > kAbsTol + kRelTol * std::abs(a[i]) && ++failures <= 5) {
      ADD_FAILURE() << name << "[" << i << "]: analytic " << a[i] << ", finite difference " << fd;
    }
  }
  EXPECT_EQ(failures, 0) << name << ": " << failures << " of " << x.numel() << " elements differ";
  // Guards against a vacuous pass (all-zero gradients where the loss does depend on x).
  if (require_nonzero) {
    EXPECT_GT(largest, 1e-3) << name << " is (nearly) zero everywhere";
  }
}

struct FdCase {
  enum class Mask { kNone, kBool, kFloat };
  std::string name;
  Shape q, k, v;  // [B, Hq, L, E], [B, Hkv, S, E], [B, Hkv, S, Ev] (or 3-D)
  bool causal = false;
  bool gqa = false;
  Mask mask = Mask::kNone;
  Shape mask_shape;  // for kBool / kFloat
  bool mask_grad = false;
  double dropout_p = 0.0;
  std::optional<double> scale;

  FdCase(std::string n, Shape q_shape, Shape k_shape, Shape v_shape)
      : name(std::move(n)), q(std::move(q_shape)), k(std::move(k_shape)), v(std::move(v_shape)) {}
  FdCase causal_() const {
    FdCase c = *this;
    c.causal = true;
    return c;
  }
  FdCase gqa_() const {
    FdCase c = *this;
    c.gqa = true;
    return c;
  }
  FdCase mask_(Mask kind, Shape shape, bool grad = false) const {
    FdCase c = *this;
    c.mask = kind;
    c.mask_shape = std::move(shape);
    c.mask_grad = grad;
    return c;
  }
  FdCase dropout_(double p) const {
    FdCase c = *this;
    c.dropout_p = p;
    return c;
  }
  FdCase scale_(double s) const {
    FdCase c = *this;
    c.scale = s;
    return c;
  }
};

std::ostream& operator<<(std::ostream& os, const FdCase& c) { return os << c.name; }

using M = FdCase::Mask;

class MathFiniteDifference : public ::testing::TestWithParam<FdCase> {};

TEST_P(MathFiniteDifference, GradientsMatchCentralDifferences) {
  const FdCase& c = GetParam();
  Tensor q = randn(c.q, DType::kFloat64, 11);
  Tensor k = randn(c.k, DType::kFloat64, 12);
  Tensor v = randn(c.v, DType::kFloat64, 13);
  Shape out_shape = c.q;
  out_shape.back() = c.v.back();
  const Tensor grad_out = randn(out_shape, DType::kFloat64, 14);

  SDPAOptions options;
  options.is_causal = c.causal;
  options.enable_gqa = c.gqa;
  options.scale = c.scale;
  Tensor mask;
  if (c.mask == M::kBool) {
    mask = random_bool(c.mask_shape, 0.6, 15);
    // Row 0 of every broadcast slice keeps no key: a fully masked row.
    for_each_index(c.mask_shape, [&](const Shape& i) {
      if (i[i.size() - 2] == 0) mask.set_item(i, 0.0);
    });
    options.attn_mask = mask;
  } else if (c.mask == M::kFloat) {
    mask = randn(c.mask_shape, DType::kFloat64, 16);
    // One -inf entry (a masked key) in the first row of every slice.
    for_each_index(c.mask_shape, [&](const Shape& i) {
      if (i[i.size() - 2] == 0 && i.back() == 0) {
        mask.set_item(i, -std::numeric_limits<double>::infinity());
      }
    });
    options.attn_mask = mask;
    options.attn_mask_requires_grad = c.mask_grad;
  }
  if (c.dropout_p > 0) {
    options.dropout_p = c.dropout_p;
    options.dropout_state = sdpa::PhiloxState{1234, 7};  // the same mask in every loss call
  }

  const FwdBwd analytic = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, options);
  EXPECT_EQ(analytic.grads.backend, SDPBackend::MATH);
  auto f = [&] { return loss(q, k, v, grad_out, options); };
  // With a single key the softmax is constant 1: q and k get exactly zero gradients.
  const bool one_key = c.k[c.k.size() - 2] == 1;
  expect_gradient("grad_q", q, analytic.grads.grad_q, f, !one_key);
  expect_gradient("grad_k", k, analytic.grads.grad_k, f, !one_key);
  expect_gradient("grad_v", v, analytic.grads.grad_v, f);
  if (c.mask_grad) {
    ASSERT_TRUE(analytic.grads.grad_attn_mask.defined());
    EXPECT_EQ(analytic.grads.grad_attn_mask.dtype(), DType::kFloat64);
    expect_gradient("grad_attn_mask", mask, analytic.grads.grad_attn_mask, f);
  } else {
    EXPECT_FALSE(analytic.grads.grad_attn_mask.defined());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Math, MathFiniteDifference,
    ::testing::Values(
        FdCase("Basic", {1, 2, 5, 3}, {1, 2, 7, 3}, {1, 2, 7, 3}),
        FdCase("OneByOne", {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}),
        FdCase("EvDiffersFromE", {2, 1, 3, 5}, {2, 1, 4, 5}, {2, 1, 4, 2}),
        FdCase("Gqa", {1, 4, 3, 3}, {1, 2, 5, 3}, {1, 2, 5, 2}).gqa_(),
        FdCase("GqaSixThree", {1, 6, 2, 3}, {1, 3, 3, 3}, {1, 3, 3, 3}).gqa_(),
        FdCase("CausalLShorter", {1, 2, 5, 3}, {1, 2, 7, 3}, {1, 2, 7, 3}).causal_(),
        FdCase("CausalLLonger", {1, 1, 7, 3}, {1, 1, 4, 3}, {1, 1, 4, 5}).causal_(),
        FdCase("CausalGqa", {1, 4, 5, 3}, {1, 2, 5, 3}, {1, 2, 5, 3}).causal_().gqa_(),
        FdCase("Unbatched", {3, 5, 3}, {3, 6, 3}, {3, 6, 2}),
        FdCase("CustomScale", {1, 2, 4, 3}, {1, 2, 5, 3}, {1, 2, 5, 3}).scale_(0.9),
        FdCase("BoolMaskWithEmptyRow", {2, 2, 5, 3}, {2, 2, 6, 3}, {2, 2, 6, 4})
            .mask_(M::kBool, {2, 2, 5, 6}),
        FdCase("BoolMaskBroadcast", {2, 2, 5, 3}, {2, 2, 6, 3}, {2, 2, 6, 4})
            .mask_(M::kBool, {5, 6}),
        FdCase("FloatMaskFull", {2, 2, 3, 3}, {2, 2, 5, 3}, {2, 2, 5, 3})
            .mask_(M::kFloat, {2, 2, 3, 5}, true),
        FdCase("FloatMaskBroadcastLS", {2, 2, 4, 3}, {2, 2, 5, 3}, {2, 2, 5, 2})
            .mask_(M::kFloat, {4, 5}, true),
        FdCase("FloatMaskBroadcastHeads", {2, 3, 4, 3}, {2, 3, 5, 3}, {2, 3, 5, 3})
            .mask_(M::kFloat, {1, 3, 1, 5}, true),
        FdCase("FloatMaskGqa", {1, 4, 3, 3}, {1, 2, 5, 3}, {1, 2, 5, 3})
            .gqa_()
            .mask_(M::kFloat, {1, 4, 3, 5}, true),
        FdCase("FloatMaskUnbatched", {2, 3, 3}, {2, 4, 3}, {2, 4, 3})
            .mask_(M::kFloat, {1, 3, 4}, true),
        FdCase("FloatMaskNoGrad", {1, 2, 4, 3}, {1, 2, 5, 3}, {1, 2, 5, 3})
            .mask_(M::kFloat, {4, 5}),
        FdCase("Dropout", {1, 2, 5, 3}, {1, 2, 6, 3}, {1, 2, 6, 4}).dropout_(0.3),
        FdCase("DropoutGqaFloatMask", {1, 4, 3, 3}, {1, 2, 6, 3}, {1, 2, 6, 3})
            .gqa_()
            .mask_(M::kFloat, {3, 6}, true)
            .dropout_(0.4)),
    [](const ::testing::TestParamInfo<FdCase>& info) { return info.param.name; });

}  // namespace
}  // namespace sdpa_test
