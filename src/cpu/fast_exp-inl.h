// Exponentials for the softmax of the CPU flash kernels: polynomial exp2 with the
// exponent built by bit shifting, exact zeros for masked (-inf) scores. Per-target code:
// include after foreach_target.h.

#if defined(SDPA_CPU_FAST_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_FAST_EXP_INL_H_
#undef SDPA_CPU_FAST_EXP_INL_H_
#else
#define SDPA_CPU_FAST_EXP_INL_H_
#endif

#include "core/kernel_inline.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2^f for f in [-0.5, 0.5]: a degree-5 polynomial 1 + f q(f), minimax in relative error
// (6.8e-8; 2.2e-7 evaluated in float32), by Horner's scheme: five FMAs. Its 20-cycle chain
// is hidden by the independent vectors in flight (a tile's rows, a row's vectors). The
// constant term is exactly 1, so 2^0 = 1: the online softmax's rescale exp(m - m) of a
// tile that leaves the running max unchanged is exactly 1 and touches no accumulator (a
// fitted 1.00000007 rounds to 1 + 2^-23, which compounded once per key tile: 4.5e-5
// relative error after 1000 masked tiles).
template <class D, class V>
SDPA_INLINE V Exp2Fraction(D d, V f) {
  V poly = hn::MulAdd(hn::Set(d, 1.3202981790527701e-3f), f, hn::Set(d, 9.674952365458012e-3f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 5.5510472506284714e-2f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 2.4022166430950165e-1f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 6.931465864181519e-1f));
  return hn::MulAdd(poly, f, hn::Set(d, 1.0f));
}

// 2^f for f in [-0.5, 0.5] for bf16 probabilities: degree 4, fitted like Exp2Fraction
// (constant term 1), relative error 2.9e-6 in float32. Rounding P to bf16 errs by up to
// 2^-8 = 3.9e-3; the row sums and the logsumexp, kept in float32, stay within float32
// tolerances (degree 3, at 7.5e-5, would not). Four FMAs instead of five.
template <class D, class V>
SDPA_INLINE V Exp2FractionBf16(D d, V f) {
  V poly = hn::MulAdd(hn::Set(d, 9.582576341927052e-3f), f, hn::Set(d, 5.590682849287987e-2f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 2.4024106562137604e-1f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 6.931241154670715e-1f));
  return hn::MulAdd(poly, f, hn::Set(d, 1.0f));
}

// 2^t for t in [-126, 127], not clamped: the caller zeroes the lanes where t < -125.5
// (whose exponent bits below are garbage); NaN stays NaN through the arithmetic.
// Exp2Fraction(t - n) times 2^n, n = round(t) built by bit shifting: adding
// 1.5 * 2^23 + 127 rounds t to the nearest integer (a tie to the one with n + 127 even) in
// the low mantissa bits, with the exponent bias already added. That replaces a round, a
// float-to-int conversion (which Highway's AVX2 ConvertTo follows with a four-instruction
// overflow fix-up) and the bias's integer add; |t - n| <= 1/2 either way.
template <class D, class V>
SDPA_INLINE V Exp2Unclamped(D d, V t) {
  const hn::RebindToSigned<D> di;
  const V kRoundMagic = hn::Set(d, 12583039.0f);  // 1.5 * 2^23 + 127, exact
  const V shifted = hn::Add(t, kRoundMagic);
  const V n = hn::Sub(shifted, kRoundMagic);
  const V poly = Exp2Fraction(d, hn::Sub(t, n));
  // shifted's bits are 0x4B400000 + 127 + n; the shift drops the 0x4B400000 (its low 22
  // bits are zero), leaving (n + 127) << 23, n + 127 in [1, 254] for t in [-126, 127].
  const auto exponent = hn::ShiftLeft<23>(hn::BitCast(di, shifted));
  return hn::Mul(poly, hn::BitCast(d, exponent));
}

#if HWY_TARGET == HWY_AVX3
// 2^t (t clamped to <= 127) where `keep`, else exactly 0. AVX-512: vrndscaleps rounds and
// vscalefps multiplies by 2^n in one instruction each, with the values of Exp2Unclamped
// (both products by 2^n are exact; a tie t = k + 1/2 may take the other integer, with the
// same accuracy); the masked vscalefps writes the exact zeros, so -inf and tiny arguments
// need neither a clamp from below nor a blend.
// kForBf16, for the bf16 softmax: the fraction by Exp2FractionBf16. kSmallArguments (the
// default for bf16): no clamp, for callers whose t stays small: <= 0 with the max
// subtracted, <= 8 under the fused tiles' lazy max (lazy_softmax-inl.h).
template <bool kForBf16 = false, bool kSmallArguments = kForBf16, class D>
SDPA_INLINE hn::Vec512<float> Exp2OrZero(D d, __mmask16 keep, hn::Vec512<float> t) {
  if (!kSmallArguments) t = hn::Min(hn::Set(d, 127.0f), t);  // x86 min keeps a NaN second operand
  // The masked form with every lane set: the plain intrinsic passes GCC 12's
  // _mm512_undefined_ps(), which -Wmaybe-uninitialized reports wherever it is inlined.
  const __m512 n = _mm512_mask_roundscale_ps(t.raw, __mmask16{0xFFFF}, t.raw,
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const hn::Vec512<float> f{_mm512_sub_ps(t.raw, n)};
  const hn::Vec512<float> poly = kForBf16 ? Exp2FractionBf16(d, f) : Exp2Fraction(d, f);
  return hn::Vec512<float>{_mm512_maskz_scalef_ps(keep, poly.raw, n)};
}
#endif

inline constexpr float kLog2e = 1.44269504088896341f;

/// exp(x) for softmax arguments (x <= ~0; not clamped above, so x must stay below 88) as
/// 2^(x log2 e); exactly 0 below -87 (so -inf, a masked score, gives 0), NaN for NaN. Cheaper than
/// a general exp, which matters because the softmax shares the FMA ports with the GEMMs.
template <class D, class V>
SDPA_INLINE V FastExp(D d, V x) {
  const V result = Exp2Unclamped(d, hn::Mul(x, hn::Set(d, kLog2e)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), result);
}

/// 2^t for t <= ~0 (below 127: not clamped), exactly 0 below -125.5 (= -87 log2 e; -inf gives 0).
/// The softmax passes t = s * (scale log2 e) - max * log2 e for unscaled scores: the scale and log2
/// e fold into one FMA (FlashAttention's exp2 trick).
template <class D, class V>
SDPA_INLINE V FastExp2(D d, V t) {
  return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, -125.5f)), Exp2Unclamped(d, t));
}

#if HWY_TARGET == HWY_AVX3
/// The lanes of x whose exponential is not flushed to zero: x >= `lowest`, or NaN (an
/// unordered compare: a NaN score must give a NaN probability, as in PyTorch).
SDPA_INLINE __mmask16 ExpKeep(__m512 x, float lowest) {
  return _mm512_cmp_ps_mask(x, _mm512_set1_ps(lowest), _CMP_NLT_UQ);
}

template <class D>
SDPA_INLINE hn::Vec512<float> FastExp(D d, hn::Vec512<float> x) {
  return Exp2OrZero(d, ExpKeep(x.raw, -87.0f), hn::Mul(x, hn::Set(d, kLog2e)));
}

template <class D>
SDPA_INLINE hn::Vec512<float> FastExp2(D d, hn::Vec512<float> t) {
  return Exp2OrZero(d, ExpKeep(t.raw, -125.5f), t);
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_FAST_EXP_INL_H_
