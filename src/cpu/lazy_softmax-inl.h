// The online softmax of a register tile of scores (q.k^T fused with the softmax, bf16 and
// float32 forward), with a lazy running max as FlashAttention-4 does on GPUs: a row's
// probabilities are taken relative to a running max that is raised only when a score
// exceeds it by more than 2^8 in probability; the output accumulator and the row sum are
// then rescaled as usual. Most tiles raise no max, so they need no horizontal reduction
// and no rescale. The row sums of such tiles stay in one vector of lanes per row
// (SoftmaxRows::l_lanes) until FoldSumLanes adds them to l. AVX-512 target only;
// include after foreach_target.h.

#if defined(SDPA_CPU_LAZY_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_LAZY_SOFTMAX_INL_H_
#undef SDPA_CPU_LAZY_SOFTMAX_INL_H_
#else
#define SDPA_CPU_LAZY_SOFTMAX_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/kernel_inline.h"
#include "cpu/fast_exp-inl.h"
#include "cpu/online_softmax-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3
// How far above the running max (in log2 units of probability) a score may lie before
// the max is raised: probabilities up to 2^8 and row sums up to 2^8 kv_len stay far from
// float32 and bf16 overflow, and bf16 rounds them with the same relative error.
inline constexpr float kLazyMaxSlackLog2 = 8.0f;

/// The lazy-max step of row r of a register tile: `scores` [kVecs] hold the row's scores
/// (times `score_scale` > 0 in the softmax's units). Raises state.m[r] when a score lies
/// more than the slack above it, rescaling state.l[r] and the row's 16 state.l_lanes by the
/// factor written to state.alpha[r] (1 when not raised, 0 for a row's first finite scores).
/// Returns the max the row's probabilities are relative to: -inf while the row has no
/// finite score, NaN once it has a NaN score (PyTorch's softmax gives the row NaN; so do
/// its probabilities, sum and output here).
template <int kVecs>
SDPA_INLINE float LazyRowMax(const __m512* scores, float score_scale, const SoftmaxRows& state,
                             int64_t r) {
  const hn::Full512<float> d;
  using V = hn::Vec512<float>;
  const float slack = kLazyMaxSlackLog2 / kLog2e;  // in scaled-score units
  float m = state.m[r];
  // Raw scores above `bound` would give probabilities above 2^slack (none when m is -inf
  // and every score is -inf: the row then stays without probabilities). The unordered
  // compare also takes NaN scores (and every score once m is NaN) to the raise.
  const __m512 bound = _mm512_set1_ps((m + slack) / score_scale);
  __mmask16 over = 0;
  for (int v = 0; v < kVecs; ++v) over |= _mm512_cmp_ps_mask(scores[v], bound, _CMP_NLE_UQ);
  float a = 1.0f;
  if (over != 0) {
    V tile{scores[0]};
    __mmask16 nan = 0;
    for (int v = 0; v < kVecs; ++v) {
      tile = hn::Max(tile, V{scores[v]});
      nan |= _mm512_cmp_ps_mask(scores[v], scores[v], _CMP_UNORD_Q);
    }
    const float tile_max = hn::GetLane(hn::MaxOfLanes(d, tile)) * score_scale;
    const float raised =
        nan != 0 || std::isnan(m) ? std::numeric_limits<float>::quiet_NaN() : std::max(m, tile_max);
    a = hn::GetLane(RescaleFactors(d, hn::Set(d, m), hn::Set(d, raised)));
    state.m[r] = m = raised;
    state.l[r] *= a;
    float* lanes = state.l_lanes + 16 * r;
    hn::Store(hn::Mul(hn::Load(d, lanes), hn::Set(d, a)), d, lanes);
  }
  state.alpha[r] = a;
  return m;
}

/// Rows [0, rows) of a query block for the fused tiles, row r at q + r * ld.
template <class T>
struct QueryRows {
  const T* q;
  int64_t ld;
  int64_t rows;

  /// Rows [r, rows).
  QueryRows from(int64_t r) const { return {q + r * ld, ld, rows - r}; }
};

/// A key tile in PackedKv's layout for the fused tiles: `depth` rows of kBlockKv keys
/// (float32 k^T: depth = E; bf16 pairs, bf16_dot.h: depth = E / 2).
template <class T>
struct KeyTile {
  const T* k;
  int64_t depth;
};

/// Calls rows_fn(r, std::integral_constant<int, R>()) for the register tiles of kRows
/// rows covering [0, rows), the last one R = rows % kRows rows high (kRows <= 6).
template <int kRows, class RowsFn>
SDPA_INLINE void ForRegisterTiles(int64_t rows, const RowsFn& rows_fn) {
  static_assert(kRows <= 6, "the tail switch covers up to 5 rows");
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) rows_fn(r, std::integral_constant<int, kRows>());
  switch (rows - r) {
    case 1:
      return rows_fn(r, std::integral_constant<int, 1>());
    case 2:
      return rows_fn(r, std::integral_constant<int, 2>());
    case 3:
      return rows_fn(r, std::integral_constant<int, 3>());
    case 4:
      return rows_fn(r, std::integral_constant<int, 4>());
    case 5:
      return rows_fn(r, std::integral_constant<int, 5>());
    default:
      return;
  }
}

/// state.l[r] += the lanes of state.l_lanes row r, which are then zeroed, for r < rows.
SDPA_INLINE void FoldSumLanes(const SoftmaxRows& state, int64_t rows) {
  const hn::Full512<float> d;
  for (int64_t r = 0; r < rows; ++r) {
    float* lanes = state.l_lanes + 16 * r;
    state.l[r] += hn::GetLane(hn::SumOfLanes(d, hn::Load(d, lanes)));
    hn::Store(hn::Zero(d), d, lanes);
  }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_LAZY_SOFTMAX_INL_H_
