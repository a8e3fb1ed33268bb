// q.k^T and the online softmax of one bf16 key tile without masks or biases, fused: a
// register tile holds six query rows' scores for all kBlockKv keys, so the softmax runs on
// the registers the vdpbf16ps products leave (lazy max: lazy_softmax-inl.h), and only
// bf16 P reaches memory. The unfused path stores float32 scores, reads them back for the
// row maxes and again for the exponentials. AVX-512 target only (vdpbf16ps CPUs); include
// after foreach_target.h.

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

#include "cpu/fast_exp-inl.h"
#include "cpu/flash_tile.h"
#include "cpu/lazy_softmax-inl.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3
#define SDPA_QK_SOFTMAX_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

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
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    const float m = LazyRowMax<kVecs>(acc[r], score_scale, row_max + r, row_sum + r,
                                      sum_lanes + 16 * r, alpha + r);
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
        // A key scoring -inf (an infinite input) drops out, as in SoftmaxTile; NaN stays.
        e[half] = Exp2OrZero<true>(d, ExpKeep(t.raw, -125.5f), t);
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
/// Updates row_max (scaled units; lazily, see lazy_softmax-inl.h), row_sum and sum_lanes
/// [rows][16] (together the row sums relative to row_max), writes alpha [rows] and P [rows,
/// kBlockKv] as bf16 bits rounded to nearest even.
SDPA_QK_SOFTMAX_ATTR inline void QkSoftmaxTileBf16(
    const uint16_t* HWY_RESTRICT q, int64_t ldq, int64_t rows, const uint16_t* HWY_RESTRICT k_pairs,
    int64_t depth_pairs, float score_scale, float* HWY_RESTRICT row_max,
    float* HWY_RESTRICT row_sum, float* HWY_RESTRICT sum_lanes, float* HWY_RESTRICT alpha,
    uint16_t* HWY_RESTRICT p) {
  // Six rows: 24 accumulators, as Bf16Gemm's register tile.
  ForRegisterTiles<6>(rows, [&](int64_t r, auto tile_rows) {
    QkSoftmaxRowsBf16<decltype(tile_rows)::value>(q + r * ldq, ldq, k_pairs, depth_pairs,
                                                  score_scale, row_max + r, row_sum + r,
                                                  sum_lanes + 16 * r, alpha + r, p + r * kBlockKv);
  });
}

#undef SDPA_QK_SOFTMAX_ATTR
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_QK_SOFTMAX_BF16_INL_H_
