// backends::allow_fp16_bf16_reduction_math_sdp and SDPAOptions::allow_fp16_bf16_reduction_math:
// MATH computes a float16 / bfloat16 forward in its own dtype, every intermediate rounded
// to it as torch's math path does without its float32 upcast. Checked against a reference
// written here that rounds at the same points (torch itself is the oracle in
// python/tests/test_reduced_math.py), and that nothing else changes.

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/harness.h"
#include "sdpa/backend.h"
#include "sdpa/sdpa.h"

namespace sdpa::test {
namespace {

// Resets the process-wide switch a test turns on.
struct SwitchReset {
  ~SwitchReset() { backends::allow_fp16_bf16_reduction_math_sdp(false); }
};

double round_to(DType dtype, double x) {
  const float f = static_cast<float>(x);
  return dtype == DType::kBFloat16 ? static_cast<float>(bfloat16(f))
                                   : static_cast<float>(float16(f));
}

// torch's math path without upcast, for q [1, 1, L, E], k [1, 1, S, E], v [1, 1, S, E],
// no mask: each step's result rounded to `dtype`. The scores' float32 dot products are
// summed in the kernel's order, so that a score near a rounding boundary rounds the same
// way (one flipped score moves its whole row by a unit or two); the other sums run in
// float64.
std::vector<double> reduced_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                      double scale) {
  const DType dt = q.dtype();
  const int64_t L = q.size(2), S = k.size(2), E = q.size(3);
  const float root = static_cast<float>(std::sqrt(scale));
  std::vector<double> out(static_cast<size_t>(L * E));
  for (int64_t i = 0; i < L; ++i) {
    std::vector<double> s(static_cast<size_t>(S));
    double max = -INFINITY;
    for (int64_t j = 0; j < S; ++j) {
      float dot = 0;
      for (int64_t e = 0; e < E; ++e) {
        dot += static_cast<float>(round_to(dt, static_cast<float>(q.item({0, 0, i, e})) * root) *
                                  round_to(dt, static_cast<float>(k.item({0, 0, j, e})) * root));
      }
      s[j] = round_to(dt, dot);
      max = std::max(max, s[j]);
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - max));
    for (int64_t e = 0; e < E; ++e) {
      double o = 0;
      for (int64_t j = 0; j < S; ++j) o += round_to(dt, s[j] / sum) * v.item({0, 0, j, e});
      out[i * E + e] = round_to(dt, o);
    }
  }
  return out;
}

// Elements of `out` [1, 1, L, E] further than `ulps` units in the last place from `want`.
// The unit is taken at |want| but at least 1/16: an output near 0 is a sum of terms near
// 1/16 that cancel, whose summation order moves it by more than its own unit.
int64_t far_elements(const Tensor& out, const std::vector<double>& want, double ulps) {
  const double eps = out.dtype() == DType::kBFloat16 ? 0x1p-7 : 0x1p-10;
  int64_t far = 0;
  for (int64_t i = 0; i < out.size(2); ++i) {
    for (int64_t e = 0; e < out.size(3); ++e) {
      const double w = want[i * out.size(3) + e];
      const double ulp = eps * std::exp2(std::floor(std::log2(std::max(std::abs(w), 0.0625))));
      far += std::abs(out.item({0, 0, i, e}) - w) > ulps * ulp;
    }
  }
  return far;
}

bool same_values(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::kFloat64).contiguous(), y = b.to(DType::kFloat64).contiguous();
  if (x.sizes() != y.sizes()) return false;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (x.data<double>()[i] != y.data<double>()[i]) return false;
  }
  return true;
}

TEST(ReducedPrecisionMath, RoundsEveryStepLikeTorchsMathPath) {
  SwitchReset reset;
  EXPECT_FALSE(backends::fp16_bf16_reduction_math_sdp_allowed());
  std::mt19937 rng(7);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const Tensor q = random_tensor({1, 1, 33, 24}, dtype, Layout::kBHSD, rng);
    const Tensor k = random_tensor({1, 1, 65, 24}, dtype, Layout::kBHSD, rng);
    const Tensor v = random_tensor({1, 1, 65, 24}, dtype, Layout::kBHSD, rng);
    const std::vector<double> want = reduced_reference(q, k, v, 1.0 / std::sqrt(24.0));
    sdpa_kernel math(SDPBackend::MATH);
    SDPAOptions per_call;
    per_call.allow_fp16_bf16_reduction_math = true;
    const Tensor by_option = scaled_dot_product_attention(q, k, v, per_call);
    backends::allow_fp16_bf16_reduction_math_sdp(true);
    EXPECT_TRUE(backends::fp16_bf16_reduction_math_sdp_allowed());
    const Tensor by_switch = scaled_dot_product_attention(q, k, v);
    backends::allow_fp16_bf16_reduction_math_sdp(false);
    const Tensor upcast = scaled_dot_product_attention(q, k, v);
    // The softmax's and P v's summation order aside (float32 in the kernel, float64 here),
    // the same roundings: at most one unit apart, and nearly all equal (the upcast default
    // differs in about 480 of the 792).
    EXPECT_EQ(far_elements(by_option, want, 1.0), 0) << dtype_name(dtype);
    EXPECT_LE(far_elements(by_option, want, 0.0), 33 * 24 / 20) << dtype_name(dtype);
    EXPECT_EQ(far_elements(by_switch, want, 0.0), far_elements(by_option, want, 0.0));
    // The float32-upcast default is a different computation.
    EXPECT_GT(far_elements(upcast, want, 0.0), 33 * 24 / 4) << dtype_name(dtype);
  }
}

TEST(ReducedPrecisionMath, LeavesOtherDtypesAndFlashAlone) {
  SwitchReset reset;
  std::mt19937 rng(8);
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    const Tensor q = random_tensor({2, 3, 17, 8}, dtype, Layout::kBHSD, rng);
    const Tensor k = random_tensor({2, 3, 40, 8}, dtype, Layout::kBHSD, rng);
    const Tensor v = random_tensor({2, 3, 40, 8}, dtype, Layout::kBHSD, rng);
    for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
      if (dtype == DType::kBFloat16 && b == SDPBackend::MATH) continue;  // the changed case
      sdpa_kernel guard(b);
      backends::allow_fp16_bf16_reduction_math_sdp(false);
      const Tensor off = scaled_dot_product_attention(q, k, v);
      backends::allow_fp16_bf16_reduction_math_sdp(true);
      const Tensor on = scaled_dot_product_attention(q, k, v);
      EXPECT_TRUE(same_values(off, on)) << dtype_name(dtype) << " " << backend_name(b);
    }
  }
}

}  // namespace
}  // namespace sdpa::test
