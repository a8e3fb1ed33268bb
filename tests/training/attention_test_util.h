#pragma once
// Helpers shared by the training (tests/training) and bias (tests/bias) suites: seeded
// random inputs in any dtype and layout, forward + backward runs pinned to one backend,
// and the dtype-scaled comparison of STYLE.md item 10.
//
// Tolerance policy (STYLE.md item 10, PyTorch test_transformers.py): a tested result x in
// dtype d is compared with the golden g = MATH run in float64 on the same (d-rounded)
// inputs. The error measure is
//     err(x, g) = max_i |x_i - g_i| / max(max_i |g_i|, 1)
// (equal infinities count as 0, any NaN as +inf): relative to the largest golden value, and
// absolute where the golden is below 1 (PyTorch's atol role; a gradient that is exactly 0
// by symmetry, e.g. grad_q with a single key, comes out as float32 rounding noise). The
// tolerance is
//     tol = fudge * max(default_tolerance(d), err(naive, g))
// where `naive` is the MATH backend run in dtype d itself: its own error says how hard the
// case is numerically (long reductions, large scores), the dtype default says what d can
// represent. Defaults are PyTorch's torch.testing rtol for d (float32 1.3e-6 rounded up to
// 1e-5 = PyTorch's atol, float16 1e-3, bfloat16 1.6e-2); fudge is kFudge for every tensor.
// So that a bug shared by MATH in dtype d and the tested backend cannot widen the tolerance
// into a vacuous pass, the naive error must itself stay below kNaiveCap * default(d) (it is
// ~10x below default(d) in every case here), else the comparison fails. lse is float32 for
// every input dtype: its tolerance starts from float32's default, and its naive error is
// capped by the input dtype's (MATH materializes an additive bias in the query dtype).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/capability.h"
#include "sdpa/sdpa.h"

namespace sdpa_test {

using sdpa::DType;
using sdpa::Shape;
using sdpa::Tensor;
using sdpa::test::ScopedCapability;
using sdpa::test::supported_capabilities;

/// Fudge factor on the tolerance (see the header comment).
inline constexpr double kFudge = 4.0;
/// Largest naive (MATH in the tested dtype) error accepted, in units of the dtype default.
inline constexpr double kNaiveCap = 4.0;
/// Smallest golden magnitude the error is taken relative to (below it the error is absolute).
inline constexpr double kUnitScale = 1.0;

/// PyTorch's default relative tolerance for `dtype` (torch.testing.assert_close).
inline double default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 1e-7;
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat16:
      return 1e-3;
    case DType::kBFloat16:
      return 1.6e-2;
    default:
      return 0.0;
  }
}

/// Iterates every multi-index of `shape` in row-major order.
template <typename F>
void for_each_index(const Shape& shape, F&& f) {
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  Shape index(shape.size(), 0);
  while (true) {
    f(static_cast<const Shape&>(index));
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

/// Contiguous float64 copy.
inline Tensor f64(const Tensor& t) { return t.to(DType::kFloat64); }

/// Contiguous float64 values of `t` in row-major order.
inline std::vector<double> values(const Tensor& t) {
  const Tensor c = f64(t);
  const double* d = c.data<double>();
  return std::vector<double>(d, d + c.numel());
}

/// Standard-normal values (times `stddev`) generated in float64 and rounded to `dtype`;
/// contiguous.
inline Tensor randn(const Shape& shape, DType dtype, uint64_t seed, double stddev = 1.0) {
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  double* d = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = normal(gen);
  return t.to(dtype);
}

/// Bernoulli(p_true) bool tensor.
inline Tensor random_bool(const Shape& shape, double p_true, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kBool);
  std::mt19937_64 gen(seed);
  std::bernoulli_distribution coin(p_true);
  for_each_index(shape, [&](const Shape& i) { t.set_item(i, coin(gen) ? 1.0 : 0.0); });
  return t;
}

/// Memory layout of a generated 4-D input [B, H, N, D].
enum class Layout {
  kBHSD,    ///< contiguous [B, H, N, D]
  kBSHD,    ///< [B, N, H, D] storage viewed through transpose(1, 2) (non-contiguous)
  kOffset,  ///< contiguous, but starting one element into its storage (misaligned)
};

/// randn in `layout`; the logical shape is always `shape` = [B, H, N, D].
inline Tensor randn_layout(const Shape& shape, DType dtype, uint64_t seed, Layout layout) {
  switch (layout) {
    case Layout::kBHSD:
      return randn(shape, dtype, seed);
    case Layout::kBSHD: {
      const Tensor logical = randn(shape, dtype, seed);
      Tensor storage = Tensor::empty({shape[0], shape[2], shape[1], shape[3]}, dtype);
      Tensor view = storage.transpose(1, 2);
      view.copy_(logical);
      return view;
    }
    case Layout::kOffset: {
      const Tensor logical = randn(shape, dtype, seed);
      Tensor storage = Tensor::empty({sdpa::checked_numel(shape) + 1}, dtype);
      Tensor view =
          Tensor::from_blob(static_cast<char*>(storage.data_ptr()) + sdpa::element_size(dtype),
                            shape, sdpa::contiguous_strides(shape), dtype, {}, storage.storage());
      view.copy_(logical);
      return view;
    }
  }
  return {};
}

/// Maximum |value| (NaN propagates as NaN, infinities are skipped).
inline double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double x : values(t)) {
    if (std::isnan(x)) return std::numeric_limits<double>::quiet_NaN();
    if (!std::isinf(x)) m = std::max(m, std::abs(x));
  }
  return m;
}

inline bool has_nan(const Tensor& t) {
  for (double x : values(t)) {
    if (std::isnan(x)) return true;
  }
  return false;
}

/// err(x, g) of the header comment. Shapes must match (else +inf).
inline double scaled_error(const Tensor& x, const Tensor& golden) {
  if (x.sizes() != golden.sizes()) return std::numeric_limits<double>::infinity();
  const std::vector<double> a = values(x), b = values(golden);
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / std::max(scale, kUnitScale);
}

/// Tolerance for `dtype` given the naive reference's own error.
inline double tolerance(DType dtype, double naive_error, double fudge = kFudge) {
  return fudge * std::max(default_tolerance(dtype), naive_error);
}

/// Checks `tested` against `golden` with the tolerance derived from `naive` (MATH in the
/// tested dtype). `what` names the tensor in the failure message.
/// `cap_dtype` (default: `dtype`) is the dtype whose default bounds the naive error: the
/// input dtype, for outputs of another dtype computed from those inputs (lse).
inline ::testing::AssertionResult close_to_golden(const std::string& what, const Tensor& tested,
                                                  const Tensor& golden, const Tensor& naive,
                                                  DType dtype, double fudge = kFudge,
                                                  std::optional<DType> cap_dtype = {}) {
  const double naive_error = scaled_error(naive, golden);
  const double err = scaled_error(tested, golden);
  const double tol = tolerance(dtype, std::isfinite(naive_error) ? naive_error : 0.0, fudge);
  if (std::getenv("SDPA_TEST_VERBOSE") != nullptr) {
    std::printf("    %-14s err %.3g  naive %.3g  tol %.3g\n", what.c_str(), err, naive_error, tol);
  }
  const DType cap = cap_dtype.value_or(dtype);
  if (!(naive_error <= kNaiveCap * default_tolerance(cap))) {
    return ::testing::AssertionFailure()
           << what << ": the naive MATH run in " << sdpa::dtype_name(cap)
           << " is itself off the float64 golden by " << naive_error << " (> " << kNaiveCap
           << " x default " << default_tolerance(cap) << "); tested error " << err;
  }
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": scaled error " << err << " > tolerance " << tol << " (dtype "
         << sdpa::dtype_name(dtype) << " default " << default_tolerance(dtype)
         << ", naive MATH error " << naive_error << ", golden max |g| " << max_abs(golden)
         << ", tested " << tested.describe() << ")";
}

/// As close_to_golden without a naive run: tolerance = fudge * default_tolerance(dtype).
inline ::testing::AssertionResult close_to(const std::string& what, const Tensor& tested,
                                           const Tensor& golden, DType dtype,
                                           double fudge = kFudge) {
  const double err = scaled_error(tested, golden);
  const double tol = fudge * default_tolerance(dtype);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": scaled error " << err << " > tolerance " << tol
                                       << " (dtype " << sdpa::dtype_name(dtype) << ")";
}

/// Bitwise equality of two tensors' contents (contiguous copies, same dtype and shape).
inline bool bit_identical(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * sdpa::element_size(x.dtype())) == 0;
}

/// True when every element is exactly zero.
inline bool all_zero(const Tensor& t) {
  for (double x : values(t)) {
    if (x != 0.0) return false;
  }
  return true;
}

/// One forward + backward.
struct FwdBwd {
  sdpa::AttentionResult fwd;
  sdpa::AttentionGradients grads;
};

/// Runs forward then backward with only `backend` allowed; the backward replays the
/// forward's dropout state. `options.dropout_state` is honoured when already set.
inline FwdBwd run_fwd_bwd(sdpa::SDPBackend backend, const Tensor& q, const Tensor& k,
                          const Tensor& v, const Tensor& grad_out, sdpa::SDPAOptions options) {
  sdpa::sdpa_kernel guard(backend);
  FwdBwd r;
  r.fwd = sdpa::scaled_dot_product_attention_with_lse(q, k, v, options);
  options.dropout_state = r.fwd.philox;
  r.grads =
      sdpa::scaled_dot_product_attention_backward(grad_out, q, k, v, r.fwd.out, r.fwd.lse, options);
  return r;
}

/// Checks a run of (FLASH or MATH) in `dtype` against the float64 MATH golden, with the
/// naive MATH run in `dtype` setting the tolerance: out, lse, grad_q, grad_k, grad_v.
inline void expect_matches_golden(const FwdBwd& tested, const FwdBwd& golden, const FwdBwd& naive,
                                  DType dtype, double fudge = kFudge) {
  EXPECT_TRUE(close_to_golden("out", tested.fwd.out, golden.fwd.out, naive.fwd.out, dtype, fudge));
  // lse is float32 for every input dtype and computed in float32, so its tolerance starts
  // from float32's default; the naive run may be limited by its inputs' dtype (MATH
  // materializes an additive bias such as ALiBi in the query dtype), so that dtype bounds
  // the naive error.
  EXPECT_TRUE(close_to_golden("lse", tested.fwd.lse, golden.fwd.lse, naive.fwd.lse, DType::kFloat32,
                              fudge, dtype));
  EXPECT_TRUE(close_to_golden("grad_q", tested.grads.grad_q, golden.grads.grad_q,
                              naive.grads.grad_q, dtype, fudge));
  EXPECT_TRUE(close_to_golden("grad_k", tested.grads.grad_k, golden.grads.grad_k,
                              naive.grads.grad_k, dtype, fudge));
  EXPECT_TRUE(close_to_golden("grad_v", tested.grads.grad_v, golden.grads.grad_v,
                              naive.grads.grad_v, dtype, fudge));
  EXPECT_EQ(tested.fwd.out.dtype(), dtype);
  EXPECT_EQ(tested.grads.grad_q.dtype(), dtype);
  EXPECT_EQ(tested.grads.grad_k.dtype(), dtype);
  EXPECT_EQ(tested.grads.grad_v.dtype(), dtype);
  EXPECT_EQ(tested.fwd.lse.dtype(), DType::kFloat32);
}

/// The message of the sdpa::Error `f` throws ("" plus a test failure when none).
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const sdpa::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected sdpa::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected sdpa::Error, nothing was thrown";
  return "";
}

}  // namespace sdpa_test
