// Exponentials for the softmax of the CPU flash kernels: polynomial exp2 with the
// exponent built by bit shifting, exact zeros for masked (-inf) scores. Per-target code:
// include after foreach_target.h.

#if defined(SDPA_CPU_FAST_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_FAST_EXP_INL_H_
#undef SDPA_CPU_FAST_EXP_INL_H_
#else
#define SDPA_CPU_FAST_EXP_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2^t for t in [-126, 127] (clamped): a degree-6 Taylor polynomial of 2^f on f in
// [-0.5, 0.5] (relative error < 2e-7) times 2^round(t) built by bit shifting. round(t)
// comes from adding 1.5 * 2^23, which leaves it in the low mantissa bits (round to
// nearest even); that replaces a round and a float-to-int conversion, which Highway's
// AVX2 ConvertTo follows with a four-instruction overflow fix-up.
template <class D, class V>
HWY_INLINE V Exp2Clamped(D d, V t) {
  const hn::RebindToSigned<D> di;
  const V kRoundMagic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23
  t = hn::Min(hn::Max(t, hn::Set(d, -126.0f)), hn::Set(d, 127.0f));
  const V shifted = hn::Add(t, kRoundMagic);
  const V n = hn::Sub(shifted, kRoundMagic);
  const V f = hn::Sub(t, n);
  V poly = hn::Set(d, 1.5403530393381606e-4f);
  poly = hn::MulAdd(poly, f, hn::Set(d, 1.3333558146428443e-3f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 9.6181291076284772e-3f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 5.5504108664821580e-2f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 2.4022650695910071e-1f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 6.9314718055994531e-1f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 1.0f));
  // shifted's bits are 0x4B400000 + n; the shift drops the 0x4B400000 (its low 9 bits are
  // zero), leaving (n + 127) << 23 with n + 127 in [1, 254].
  const auto exponent = hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, shifted), hn::Set(di, 127)));
  return hn::Mul(poly, hn::BitCast(d, exponent));
}

inline constexpr float kLog2e = 1.44269504088896341f;

/// exp(x) for softmax arguments (x <= ~0) as 2^(x log2 e); exactly 0 below -87 (so -inf,
/// a masked score, gives 0). Cheaper than a general exp, which matters because the
/// softmax shares the FMA ports with the GEMMs.
template <class D, class V>
HWY_INLINE V FastExp(D d, V x) {
  const V result = Exp2Clamped(d, hn::Mul(x, hn::Set(d, kLog2e)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), result);
}

/// 2^t for t <= ~0, exactly 0 below -125.5 (= -87 log2 e; -inf gives 0). The softmax
/// passes t = s * (scale log2 e) - max * log2 e for unscaled scores: the scale and log2 e
/// fold into one FMA (FlashAttention's exp2 trick).
template <class D, class V>
HWY_INLINE V FastExp2(D d, V t) {
  return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, -125.5f)), Exp2Clamped(d, t));
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_FAST_EXP_INL_H_
