// q.k^T and the online softmax of one float32 key tile without masks or biases, fused: a
// register tile holds six query rows' scores for all kBlockKv keys, so the softmax runs on
// the registers the FMAs leave (lazy max: lazy_softmax-inl.h) and only P reaches memory.
// A flex score_mod of the forms that run on registers (score + X, score chains) is applied
// to each row there too (FlexScoreModRows). Tiles that biases, other score_mods or masks
// change are computed in memory first and then take the same register softmax
// (SoftmaxTileLazyF32): one load of the scores instead of SoftmaxTile's max pass and
// exponential pass. AVX-512 target only (32 vector registers); include after
// foreach_target.h.

#if defined(SDPA_CPU_QK_SOFTMAX_F32_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_QK_SOFTMAX_F32_INL_H_
#undef SDPA_CPU_QK_SOFTMAX_F32_INL_H_
#else
#define SDPA_CPU_QK_SOFTMAX_F32_INL_H_
#endif

#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/kernel_inline.h"
#include "cpu/fast_exp-inl.h"
#include "cpu/flash_tile.h"
#include "cpu/gemm-inl.h"
#include "cpu/lazy_softmax-inl.h"
#include "cpu/online_softmax-inl.h"
#include "flex/eval_row-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX3
/// What a fused tile does to its register rows before the softmax: mod(r, x) may change
/// the scores x[v] (keys 16 v..) of the q-block's row r. NoScoreMod leaves them.
struct NoScoreMod {
  template <int kVecs>
  SDPA_INLINE void operator()(int64_t, hn::Vec512<float> (&)[kVecs]) const {}
};

/// A flex score_mod that runs on registers (flex::ScoreModRunsInRegisters), for the rows
/// of the q-block that starts at query q_begin of (b, h), over the key tile at j0 (one
/// object per tile: it keeps the lookups of the rows' chunk).
struct FlexScoreModRows {
  flex::RowBuffers* buf;
  int64_t b, h, q_begin, j0;
  mutable flex::HWY_NAMESPACE::RegisterModRows rows{};

  template <int kVecs>
  SDPA_INLINE void operator()(int64_t r, hn::Vec512<float> (&x)[kVecs]) const {
    flex::HWY_NAMESPACE::ScoreModRegisterRow<kVecs>(*buf, {b, h, q_begin + r, 1, j0}, rows,
                                                    hn::Full512<float>(), x);
  }
};

/// The ALiBi bias on register rows: row r's first key lies first_offset - r keys from the
/// row's ALiBi center, and x[v] -= slope * |distance| lane by lane. The operations are
/// AddAlibiRow's (tile_ops-inl.h), so a fused tile's scores equal those computed in memory.
struct AlibiRows {
  float slope;
  int64_t first_offset;  // the tile's first key minus row 0's center

  template <int kVecs>
  SDPA_INLINE void operator()(int64_t r, hn::Vec512<float> (&x)[kVecs]) const {
    const hn::Full512<float> d;
    const auto neg_slope = hn::Set(d, -slope);
    const auto step = hn::Set(d, 16.0f);
    auto position = hn::Iota(d, static_cast<float>(first_offset - r));
    for (int v = 0; v < kVecs; ++v) {
      x[v] = hn::MulAdd(neg_slope, hn::Abs(position), x[v]);
      position = hn::Add(position, step);
    }
  }
};

/// A band's keys on register rows: lanes of row r outside its kept keys [lo[r], hi[r])
/// (offsets in the key tile, 0 <= lo <= hi <= kBlockKv) become -inf, as MaskScoreRow sets
/// them in memory. The registers hold the tile's keys from `first_lane` (a multiple of 16).
struct BandRows {
  const int64_t* lo;
  const int64_t* hi;
  int64_t first_lane = 0;

  template <int kVecs>
  SDPA_INLINE void operator()(int64_t r, hn::Vec512<float> (&x)[kVecs]) const {
    static_assert(kBlockKv <= 64, "a row's lanes are one 64-bit word");
    const uint64_t below_hi = hi[r] >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi[r]) - 1;
    const uint64_t keep =
        (below_hi & (lo[r] >= 64 ? uint64_t{0} : ~uint64_t{0} << lo[r])) >> first_lane;
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int v = 0; v < kVecs; ++v) {
      const __mmask16 lanes = static_cast<__mmask16>(keep >> (16 * v));
      x[v] = hn::Vec512<float>{_mm512_mask_blend_ps(lanes, neg_inf, x[v].raw)};
    }
  }
};

// The lazy-max online softmax of register-tile rows [0, kRows) (q-block rows row0..):
// acc[r] holds row r's kBlockKv scores (in the softmax's units), which mod changes first;
// P rows (kBlockKv floats) go to p.
template <int kRows, int kVecs, class ScoreMod = NoScoreMod>
SDPA_INLINE void SoftmaxRegisterRowsF32(__m512 (&acc)[kRows][kVecs], const SoftmaxRows& state,
                                        float* HWY_RESTRICT p, const ScoreMod& mod = {},
                                        int64_t row0 = 0) {
  const hn::Full512<float> d;
  using V = hn::Vec512<float>;
  const V log2e = hn::Set(d, kLog2e);
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    if constexpr (!std::is_same_v<ScoreMod, NoScoreMod>) {
      V x[kVecs];
      for (int v = 0; v < kVecs; ++v) x[v] = V{acc[r][v]};
      mod(row0 + r, x);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = x[v].raw;
    }
    const float m = LazyRowMax<kVecs>(acc[r], 1.0f, state, r);
    float* out = p + r * kBlockKv;
    if (!has_finite_score(m)) {
      for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(out + 16 * v, _mm512_setzero_ps());
      continue;
    }
    float* lanes = state.l_lanes + 16 * r;
    const V off = hn::Set(d, m * kLog2e);
    V sum = hn::Load(d, lanes);
    for (int v = 0; v < kVecs; ++v) {
      const V t = hn::MulSub(V{acc[r][v]}, log2e, off);
      // A key scoring -inf (masked, or an infinite input) drops out, as in SoftmaxTile;
      // NaN stays.
      const V e = Exp2OrZero<false, true>(d, ExpKeep(t.raw, -125.5f), t);
      sum = hn::Add(sum, e);
      hn::StoreU(e, d, out + 16 * v);
    }
    hn::Store(sum, d, lanes);
  }
}

// Rows [0, kRows) of a query block (its rows row0..): scores = q . k^T, changed by mod,
// then the lazy-max online softmax of `state`'s rows; P rows (kBlockKv floats) go to p.
// Only keys [16 v0, 16 (v0 + kVecs)) are computed (and their P lanes written): the rows
// keep no other key of the tile.
template <int kRows, int kVecs = static_cast<int>(kBlockKv / 16), class ScoreMod>
SDPA_INLINE void QkSoftmaxRowsF32(const QueryRows<float>& q, const KeyTile<float>& k,
                                  const SoftmaxRows& state, float* HWY_RESTRICT p,
                                  const ScoreMod& mod, int64_t row0, int64_t v0 = 0) {
  __m512 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t e = 0; e < k.depth; ++e) {
    __m512 kv[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      kv[v] = _mm512_loadu_ps(k.k + e * kBlockKv + 16 * (v0 + v));
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512 qv = _mm512_set1_ps(q.q[r * q.ld + e]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_fmadd_ps(qv, kv[v], acc[r][v]);
    }
  }
  SoftmaxRegisterRowsF32<kRows>(acc, state, p + 16 * v0, mod, row0);
}

/// Fused q.k^T and online softmax of a key tile no mask touches, for query rows [0, q.rows)
/// of a block (rows <= kBlockQ): q float32 already times the softmax scale, k PackedKv's
/// k^T [E, kBlockKv]; `mod` (NoScoreMod, FlexScoreModRows, AlibiRows) changes each row's
/// scores before its softmax. Updates state's m (lazily, see lazy_softmax-inl.h), l
/// and l_lanes (together the row sums relative to m), writes state.alpha and P [rows,
/// kBlockKv].
template <class ScoreMod = NoScoreMod>
SDPA_INLINE void QkSoftmaxTileF32(const QueryRows<float>& q, const KeyTile<float>& k,
                                  const SoftmaxRows& state, float* HWY_RESTRICT p,
                                  const ScoreMod& mod = {}) {
  // Six rows: 24 accumulators, as Gemm's register tile.
  ForRegisterTiles<6>(q.rows, [&](int64_t r, auto tile_rows) {
    QkSoftmaxRowsF32<decltype(tile_rows)::value>(q.from(r), k, state.from(r), p + r * kBlockKv,
                                                 mod, r);
  });
}

/// QkSoftmaxTileF32 for a tile whose rows keep the intervals of keys [lo[r], hi[r])
/// (offsets in the tile): each register tile computes only the 16-key vectors its rows'
/// intervals reach, and masks the rest of them in registers (BandRows). P is written for
/// those vectors only, which cover the union of the intervals of each six rows from row 0:
/// the caller's P.v (GemmAccumulateRowSupport, panels of kGemmRows = 6 rows) reads no
/// other lane.
SDPA_INLINE void QkBandSoftmaxTileF32(const QueryRows<float>& q, const KeyTile<float>& k,
                                      const int64_t* lo, const int64_t* hi,
                                      const SoftmaxRows& state, float* HWY_RESTRICT p) {
  ForRegisterTiles<6>(q.rows, [&](int64_t r, auto tile_rows) {
    constexpr int kRows = decltype(tile_rows)::value;
    int64_t first, last;
    PanelSupport({lo, hi}, r, kRows, first, last);
    // Rows that keep no key here still take one masked vector: the softmax sets their
    // rescale factors.
    const int64_t v0 = first < last ? first / 16 : 0;
    const int64_t vecs = first < last ? (last + 15) / 16 - v0 : 1;
    const BandRows band{lo, hi, 16 * v0};
    const auto rows = [&](auto kVecs) {
      QkSoftmaxRowsF32<kRows, decltype(kVecs)::value>(q.from(r), k, state.from(r),
                                                      p + r * kBlockKv, band, r, v0);
    };
    static_assert(kBlockKv == 64, "one to four vectors of keys");
    switch (vecs) {
      case 1:
        return rows(std::integral_constant<int, 1>());
      case 2:
        return rows(std::integral_constant<int, 2>());
      case 3:
        return rows(std::integral_constant<int, 3>());
      default:
        return rows(std::integral_constant<int, 4>());
    }
  });
}

/// The online softmax of a float32 score tile computed and masked in memory (biases,
/// score_mod, masks: -inf lanes drop out), with the fused tiles' lazy max: `scores` rows
/// [0, scores.rows) of kBlockKv floats, scale 1 (q carries it), become P in place. Same
/// state updates as QkSoftmaxTileF32, so that tiles of either kind follow each other
/// without FoldSumLanes; SoftmaxTile's max pass over memory and its per-row rescale
/// become one register pass.
SDPA_INLINE void SoftmaxTileLazyF32(const ScoreRows& scores, const SoftmaxRows& state) {
  constexpr int kVecs = static_cast<int>(kBlockKv / 16);
  ForRegisterTiles<6>(scores.rows, [&](int64_t r, auto tile_rows) {
    constexpr int kRows = decltype(tile_rows)::value;
    float* rows = scores.s + r * kBlockKv;
    __m512 acc[kRows][kVecs];
    for (int i = 0; i < kRows; ++i) {
      for (int v = 0; v < kVecs; ++v) acc[i][v] = _mm512_loadu_ps(rows + i * kBlockKv + 16 * v);
    }
    SoftmaxRegisterRowsF32<kRows>(acc, state.from(r), rows);
  });
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_QK_SOFTMAX_F32_INL_H_
