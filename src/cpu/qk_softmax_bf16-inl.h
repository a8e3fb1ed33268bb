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
#include "cpu/online_softmax-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3
#define SDPA_QK_SOFTMAX_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// Rows [0, kRows) of a query block: scores = q . k^T (bf16 pairs), then the lazy-max
// online softmax of `state`'s rows; P rows (kBlockKv bf16) go to p.
template <int kRows>
SDPA_QK_SOFTMAX_ATTR inline void QkSoftmaxRowsBf16(const QueryRows<uint16_t>& q,
                                                   const KeyTile<uint16_t>& k, float score_scale,
                                                   const SoftmaxRows& state,
                                                   uint16_t* HWY_RESTRICT p) {
  constexpr int kVecs = static_cast<int>(kBlockKv / 16);
  static_assert(kVecs % 2 == 0, "P rows convert in pairs of vectors");
    __m512 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < k.depth; ++d) {
    __m512bh kv[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      kv[v] = (__m512bh)_mm512_loadu_si512(k.k + d * 2 * kBlockKv + 32 * v);
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      std::memcpy(&pair, q.q + r * q.ld + 2 * d, sizeof pair);
      const __m512bh qv = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], qv, kv[v]);
    }
  }

  const hn::Full512<float> d;
  using V = hn::Vec512<float>;
  const V c{_mm512_set1_ps(score_scale * kLog2e)};
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    const float m = LazyRowMax<kVecs>(acc[r], score_scale, state, r);
    uint16_t* out = p + r * kBlockKv;
    if (!has_finite_score(m)) {
      for (int v = 0; v < kVecs; v += 2) {
        _mm512_storeu_si512(out + 16 * v, _mm512_setzero_si512());
      }
      continue;
    }
    float* lanes = state.l_lanes + 16 * r;
    const V off = hn::Set(d, m * kLog2e);
    V sum = hn::Load(d, lanes);
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
    hn::Store(sum, d, lanes);
  }
}

/// Fused q.k^T and online softmax of a key tile no mask, bias or score_mod touches, for
/// query rows [0, q.rows) of a block (rows <= kBlockQ): q bf16 bits (unscaled), k pairs
/// [E / 2][kBlockKv][2] (bf16_dot.h), score_scale > 0 the softmax scale. Updates state's m
/// (scaled units; lazily, see lazy_softmax-inl.h), l and l_lanes (together the row sums
/// relative to m), writes state.alpha and P [rows, kBlockKv] as bf16 bits rounded to
/// nearest even.
SDPA_QK_SOFTMAX_ATTR inline void QkSoftmaxTileBf16(const QueryRows<uint16_t>& q,
                                                   const KeyTile<uint16_t>& k, float score_scale,
                                                   const SoftmaxRows& state,
                                                   uint16_t* HWY_RESTRICT p) {
  // Six rows: 24 accumulators, as Bf16Gemm's register tile.
  ForRegisterTiles<6>(q.rows, [&](int64_t r, auto tile_rows) {
    QkSoftmaxRowsBf16<decltype(tile_rows)::value>(q.from(r), k, score_scale, state.from(r),
                                                  p + r * kBlockKv);
  });
}

#undef SDPA_QK_SOFTMAX_ATTR
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_QK_SOFTMAX_BF16_INL_H_
