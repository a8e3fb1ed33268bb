// q.k^T and the online softmax of one bf16 key tile without masks or biases, fused: a
// register tile holds six query rows' scores for all kBlockKv keys, so the softmax runs on
// the registers the vdpbf16ps products leave, and only bf16 P reaches memory. The
// unfused path stores float32 scores, reads them back for the row maxes and again for the
// exponentials. AVX-512 target only (vdpbf16ps CPUs); include after foreach_target.h.
//
// Lazy max (as FlashAttention-4 does on GPUs): a row's probabilities are taken relative
// to a running max that is raised only when a score exceeds it by more than 2^8 in
// probability; the output accumulator and the row sum are then rescaled as usual. Most
// tiles raise no max, so they need no horizontal reduction and no rescale. The row sums
// of such tiles stay in one vector of lanes per row (FlashScratch::sum_lanes) until
// FoldSumLanes adds them to row_sum.

#if defined(SDPA_CPU_QK_SOFTMAX_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_QK_SOFTMAX_BF16_INL_H_
#undef SDPA_CPU_QK_SOFTMAX_BF16_INL_H_
#else
#define SDPA_CPU_QK_SOFTMAX_BF16_INL_H_
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/fast_exp-inl.h"
#include "cpu/flash_tile.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3
#define SDPA_QK_SOFTMAX_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// How far above the running max (in log2 units of probability) a score may lie before
// the max is raised: probabilities up to 2^8 and row sums up to 2^8 kv_len stay far from
// float32 and bf16 overflow, and bf16 rounds them with the same relative error.
inline constexpr float kLazyMaxSlackLog2 = 8.0f;

// Rows [0, kRows) of a query block: scores = q . k^T (q rows of `ldq` bf16, k_pairs in
// bf16_dot.h's pair layout over depth_pairs), then the lazy-max online softmax; P rows
// (kBlockKv bf16) go to p. alpha[r] gets the factor row r's accumulator must be scaled by.
template <int kRows>
SDPA_QK_SOFTMAX_ATTR inline void QkSoftmaxRowsBf16(
    const uint16_t* HWY_RESTRICT q, int64_t ldq, const uint16_t* HWY_RESTRICT k_pairs,
    int64_t depth_pairs, float score_scale, float* HWY_RESTRICT row_max,
    float* HWY_RESTRICT row_sum, float* HWY_RESTRICT sum_lanes, float* HWY_RESTRICT alpha,
    uint16_t* HWY_RESTRICT p) {
  constexpr int kVecs = static_cast<int>(kBlockKv / 16);
  static_assert(kVecs % 2 == 0, "P rows convert in pairs of vectors");
  __m512 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < depth_pairs; ++d) {
    __m512bh kv[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      kv[v] = (__m512bh)_mm512_loadu_si512(k_pairs + d * 2 * kBlockKv + 32 * v);
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      std::memcpy(&pair, q + r * ldq + 2 * d, sizeof pair);
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], qv, kv[v]);
    }
  }

  const hn::Full512<float> d;
  using V = hn::Vec512<float>;
  const V c{_mm512_set1_ps(score_scale * kLog2e)};
  const __m512 lowest = _mm512_set1_ps(-125.5f);   // FastExp2's zero threshold
  const float slack = kLazyMaxSlackLog2 / kLog2e;  // in scaled-score units
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    float m = row_max[r];
    // Raw scores above `bound` would give probabilities above 2^slack (none when m is
    // -inf and every score is -inf: the row then stays without probabilities).
    const __m512 bound = _mm512_set1_ps((m + slack) / score_scale);
    __mmask16 over = 0;
    for (int v = 0; v < kVecs; ++v) over |= _mm512_cmp_ps_mask(acc[r][v], bound, _CMP_GT_OQ);
    float a = 1.0f;
    if (over != 0) {
      V tile{acc[r][0]};
      for (int v = 1; v < kVecs; ++v) tile = hn::Max(tile, V{acc[r][v]});
      const float raised = std::max(m, hn::GetLane(hn::MaxOfLanes(d, tile)) * score_scale);
      // 0 for a row's first finite scores (its accumulator and sums are still 0).
      a = hn::GetLane(FastExp(d, hn::Set(d, m - raised)));
      row_max[r] = m = raised;
      row_sum[r] *= a;
      hn::Store(hn::Mul(hn::Load(d, sum_lanes + 16 * r), hn::Set(d, a)), d, sum_lanes + 16 * r);
    }
    alpha[r] = a;
    uint16_t* out = p + r * kBlockKv;
    if (m == kNegInf) {
      for (int v = 0; v < kVecs; v += 2) {
        _mm512_storeu_si512(out + 16 * v, _mm512_setzero_si512());
      }
      continue;
    }
    const V off = hn::Set(d, m * kLog2e);
    V sum = hn::Load(d, sum_lanes + 16 * r);
    for (int v = 0; v < kVecs; v += 2) {
      V e[2];
      for (int half = 0; half < 2; ++half) {
        const V t = hn::MulSub(V{acc[r][v + half]}, c, off);
        // A key scoring -inf (an infinite input) drops out, as in SoftmaxTile.
        e[half] = Exp2OrZero<true>(d, _mm512_cmp_ps_mask(t.raw, lowest, _CMP_GE_OQ), t);
      }
      sum = hn::Add(sum, hn::Add(e[0], e[1]));
      _mm512_storeu_si512(out + 16 * v, (__m512i)_mm512_cvtne2ps_pbh(e[1].raw, e[0].raw));
    }
    hn::Store(sum, d, sum_lanes + 16 * r);
  }
}

/// Fused q.k^T and online softmax of a key tile no mask, bias or score_mod touches, for
/// query rows [0, rows) of a block (rows <= kBlockQ): q [rows, ldq] bf16 bits (unscaled),
/// k_pairs [depth_pairs][kBlockKv][2] (bf16_dot.h), score_scale > 0 the softmax scale.
/// Updates row_max (scaled units; lazily, see above), row_sum and sum_lanes [rows][16]
/// (together the row sums relative to row_max), writes alpha [rows] and P [rows,
/// kBlockKv] as bf16 bits rounded to nearest even.
SDPA_QK_SOFTMAX_ATTR inline void QkSoftmaxTileBf16(
    const uint16_t* HWY_RESTRICT q, int64_t ldq, int64_t rows, const uint16_t* HWY_RESTRICT k_pairs,
    int64_t depth_pairs, float score_scale, float* HWY_RESTRICT row_max,
    float* HWY_RESTRICT row_sum, float* HWY_RESTRICT sum_lanes, float* HWY_RESTRICT alpha,
    uint16_t* HWY_RESTRICT p) {
  constexpr int64_t kRows = 6;  // 24 accumulators: as Bf16Gemm's register tile
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    QkSoftmaxRowsBf16<kRows>(q + r * ldq, ldq, k_pairs, depth_pairs, score_scale, row_max + r,
                             row_sum + r, sum_lanes + 16 * r, alpha + r, p + r * kBlockKv);
  }
  const auto tail = [&](auto rows_left) {
    QkSoftmaxRowsBf16<decltype(rows_left)::value>(q + r * ldq, ldq, k_pairs, depth_pairs,
                                                  score_scale, row_max + r, row_sum + r,
                                                  sum_lanes + 16 * r, alpha + r, p + r * kBlockKv);
  };
  switch (rows - r) {
    case 1:
      return tail(std::integral_constant<int, 1>());
    case 2:
      return tail(std::integral_constant<int, 2>());
    case 3:
      return tail(std::integral_constant<int, 3>());
    case 4:
      return tail(std::integral_constant<int, 4>());
    case 5:
      return tail(std::integral_constant<int, 5>());
    default:
      return;
  }
}

/// row_sum[r] += the lanes of sum_lanes row r, which are then zeroed, for r < rows.
SDPA_QK_SOFTMAX_ATTR inline void FoldSumLanes(int64_t rows, float* HWY_RESTRICT sum_lanes,
                                              float* HWY_RESTRICT row_sum) {
  const hn::Full512<float> d;
  for (int64_t r = 0; r < rows; ++r) {
    row_sum[r] += hn::GetLane(hn::SumOfLanes(d, hn::Load(d, sum_lanes + 16 * r)));
    hn::Store(hn::Zero(d), d, sum_lanes + 16 * r);
  }
}
#undef SDPA_QK_SOFTMAX_ATTR
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_QK_SOFTMAX_BF16_INL_H_
