// Float32 transcendentals of flex programs for the FLASH kernels: exp and log over their
// whole domains (Highway's are valid on part of them only) and a tanh cheaper than
// Highway's. Per-target code: include after foreach_target.h.

#if defined(SDPA_FLEX_EVAL_MATH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_FLEX_EVAL_MATH_INL_H_
#undef SDPA_FLEX_EVAL_MATH_INL_H_
#else
#define SDPA_FLEX_EVAL_MATH_INL_H_
#endif

#include "core/kernel_inline.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::flex {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// exp over every float32: Highway's Exp is valid only up to about 88.7 (above, garbage
/// instead of +inf: exp(100 s) gave finite scores where MATH overflows) and down to -104.
template <class D, class V>
SDPA_INLINE V ExpAllInputs(D d, V x) {
  V e = hn::Exp(d, x);
  e = hn::IfThenElse(hn::Gt(x, hn::Set(d, 88.72283f)), hn::Inf(d), e);
  e = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -103.972f)), e);
  return hn::IfThenElse(hn::IsNaN(x), x, e);
}

/// log over every float32 as std::log: Highway's Log is valid only on (0, FLT_MAX] (log of
/// a negative score gave finite garbage where MATH gives NaN; log(0) gave -102, not -inf).
template <class D, class V>
SDPA_INLINE V LogAllInputs(D d, V x) {
  const V zero = hn::Zero(d);
  // Lanes in Log's domain take it; the others get a harmless 1 and are replaced below.
  const auto valid = hn::And(hn::Gt(x, zero), hn::Lt(x, hn::Inf(d)));
  V r = hn::Log(d, hn::IfThenElse(valid, x, hn::Set(d, 1.0f)));
  r = hn::IfThenElse(hn::Eq(x, zero), hn::Neg(hn::Inf(d)), r);
  r = hn::IfThenElse(hn::Eq(x, hn::Inf(d)), x, r);
  // Negative inputs (-inf included) and NaN: NaN.
  return hn::IfThenElse(hn::Or(hn::Lt(x, zero), hn::IsNaN(x)), hn::NaN(d), r);
}

/// tanh for float32 lanes (max error ~3 ulp, NaN propagates): an odd polynomial below
/// |x| = 0.55 (coefficients fitted for this kernel by weighted least squares on Chebyshev
/// nodes; <= 1.1 ulp there), (1 - e) / (1 + e) with e = exp(-2|x|) above, the division by a
/// Newton-refined reciprocal. Cheaper than hn::Tanh (Expm1 and a full division), which
/// dominated soft-capping score_mods.
template <class D, class V>
SDPA_INLINE V FastTanh(D d, V x) {
  // The odd polynomial on x itself (exactly odd: no abs and sign restore needed).
  const V x2 = hn::Mul(x, x);
  V poly = hn::Set(d, -6.287600915043896e-3f);
  poly = hn::MulAdd(poly, x2, hn::Set(d, 2.1082018617073817e-2f));
  poly = hn::MulAdd(poly, x2, hn::Set(d, -5.3855110696803404e-2f));
  poly = hn::MulAdd(poly, x2, hn::Set(d, 1.333261678740885e-1f));
  poly = hn::MulAdd(poly, x2, hn::Set(d, -3.333331865002002e-1f));
  const V small = hn::MulAdd(hn::Mul(x2, x), poly, x);
  const auto is_small = hn::Lt(x2, hn::Set(d, 0.55f * 0.55f));  // false for NaN
  // Soft-capped scores are mostly far below the cap: skip the exponential branch then.
  if (hn::AllTrue(d, is_small)) return small;
  const V a = hn::Abs(x);
  const V one = hn::Set(d, 1.0f);
  const V e = hn::Exp(d, hn::Mul(a, hn::Set(d, -2.0f)));  // in (0, 1]: no overflow
  const V den = hn::Add(one, e);
  V r = hn::ApproximateReciprocal(den);
  r = hn::Mul(r, hn::NegMulAdd(den, r, hn::Set(d, 2.0f)));  // one Newton step
  r = hn::Mul(r, hn::NegMulAdd(den, r, hn::Set(d, 2.0f)));  // 14 -> 28 -> full bits
  const V big = hn::CopySignToAbs(hn::Mul(hn::Sub(one, e), r), x);
  return hn::IfThenElse(hn::IsNaN(x), x, hn::IfThenElse(is_small, small, big));
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::flex
HWY_AFTER_NAMESPACE();

#endif  // SDPA_FLEX_EVAL_MATH_INL_H_
