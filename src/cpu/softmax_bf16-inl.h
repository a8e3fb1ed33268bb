// The online softmax of the bf16 kernels, whose P.v product multiplies P in bfloat16: it
// writes P rounded to bf16 in the pass that computes it, with an exponential polynomial
// sized to bf16 (Exp2FractionBf16), instead of SoftmaxTile's float32 store, reload and
// conversion. AVX-512 target only (vdpbf16ps CPUs); include after foreach_target.h.

#if defined(SDPA_CPU_SOFTMAX_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_SOFTMAX_BF16_INL_H_
#undef SDPA_CPU_SOFTMAX_BF16_INL_H_
#else
#define SDPA_CPU_SOFTMAX_BF16_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/fast_exp-inl.h"
#include "cpu/flash_tile.h"
#include "cpu/online_softmax-inl.h"
#include "cpu/reduce_lanes-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3
// The target adds avx512bf16 to Highway's AVX-512 set for vcvtne2ps2bf16; the Highway
// helpers inline into these functions since their set is a subset.
#define SDPA_SOFTMAX_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// kPrescaled: the scores are already scaled (score_scale 1) and subtract the max before
// the multiply by log2 e, as in SoftmaxTile; a template argument so that the choice is
// not made per vector.
template <bool kPrescaled>
SDPA_SOFTMAX_BF16_ATTR inline void SoftmaxTileToBf16Impl(const ScoreRows& tile,
                                                         const SoftmaxRows& state,
                                                         uint16_t* HWY_RESTRICT p, float slack) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(d));
  static_assert(kBlockKv % (2 * N) == 0, "P rows convert in pairs of vectors");
  const V log2e = hn::Set(d, kLog2e);
  const V c = hn::Set(d, tile.scale * kLog2e);
  for (int64_t r0 = 0; r0 < tile.rows; r0 += N) {
    HWY_ALIGN float maxes[N];
    hn::Store(RaiseRowMaxes(d, tile, r0, {nullptr, nullptr}, state, slack), d, maxes);
    V v[N];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t r = r0 + k;
      v[k] = hn::Zero(d);
      if (r >= tile.rows) continue;
      const float* row = tile.s + r * kBlockKv;
      uint16_t* out = p + r * kBlockKv;
      if (!has_finite_score(maxes[k])) {  // as in SoftmaxTile
        const float fill = NoFiniteScoreFill(row, row + kBlockKv);
        std::fill(out, out + kBlockKv, std::isnan(fill) ? uint16_t{0x7FC0} : uint16_t{0});
        v[k] = hn::Set(d, fill);
        continue;
      }
      const V m = hn::Set(d, maxes[k]);
      const V off = hn::Mul(m, log2e);
      for (int64_t j = 0; j < kBlockKv; j += 2 * N) {
        V e[2];
        for (int64_t half = 0; half < 2; ++half) {
          const V x = hn::LoadU(d, row + j + half * N);
          const V t = kPrescaled ? hn::Mul(hn::Sub(x, m), log2e) : hn::MulSub(x, c, off);
          // Also on tiles without masks: a key scoring -inf (an infinite input) then drops
          // out as in SoftmaxTile instead of turning the row sum into NaN.
          const __mmask16 keep = ExpKeep(t.raw, -125.5f);
          e[half] = Exp2OrZero<true>(d, keep, t);
          v[k] = hn::Add(v[k], e[half]);
        }
        _mm512_storeu_si512(out + j, (__m512i)_mm512_cvtne2ps_pbh(e[1].raw, e[0].raw));
      }
    }
    const V sums = ReduceLanesTree(d, v, AddLanes());
    hn::StoreU(hn::MulAdd(hn::LoadU(d, state.l + r0), hn::LoadU(d, state.alpha + r0), sums), d,
               state.l + r0);
  }
}

/// SoftmaxTile without a support (masked keys are already -inf) whose probabilities go to
/// p instead of over the scores: row r of p (uint16_t bf16 bits, rows of kBlockKv) gets
/// row r's probabilities rounded to nearest even. l adds them before rounding, as
/// FlashAttention-2 does on GPUs. The scores are read only. Callers with dropout use
/// SoftmaxTile: dropout draws on float32 P. `slack`: RaiseRowMaxes' (P up to e^slack).
SDPA_SOFTMAX_BF16_ATTR inline void SoftmaxTileToBf16(const ScoreRows& tile,
                                                     const SoftmaxRows& state,
                                                     uint16_t* HWY_RESTRICT p,
                                                     float slack = 0.0f) {
  const auto impl =
      tile.scale == 1.0f ? &SoftmaxTileToBf16Impl<true> : &SoftmaxTileToBf16Impl<false>;
  impl(tile, state, p, slack);
}
#undef SDPA_SOFTMAX_BF16_ATTR
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_SOFTMAX_BF16_INL_H_
