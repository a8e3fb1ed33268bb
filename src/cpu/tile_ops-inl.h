// Score-row masking and small row helpers shared by the CPU flash forward and backward. Per-target
// code: include after foreach_target.h.

#if defined(SDPA_CPU_TILE_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_TILE_OPS_INL_H_
#undef SDPA_CPU_TILE_OPS_INL_H_
#else
#define SDPA_CPU_TILE_OPS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/flash_tile.h"
#include "cpu/mask_rows.h"
#include "cpu/pack.h"
#include "cpu/rows.h"
#include "flex/eval_row-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Adds the additive terms (dense float mask over [lo, hi), ALiBi) to score row s of query
/// row i of (b, h) over key tile [j0, j0 + kBlockKv).
HWY_INLINE void AddScoreTerms(const AttentionParams& p, const DenseMaskRows& dense, int64_t h,
                              int64_t i, int64_t j0, int64_t lo, int64_t hi,
                              float* HWY_RESTRICT s) {
  if (dense.additive()) dense.apply(i, j0 + lo, hi - lo, s + lo);
  const AlibiRow alibi = alibi_row(p.mask, h, i, p.q_len, p.kv_len);
  if (alibi.active) {
    // s[j] -= slope * |j0 + j - center|; lanes outside [lo, hi) are masked afterwards.
    const hn::ScalableTag<float> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto neg_slope = hn::Set(d, -alibi.slope);
    for (int64_t j = 0; j < kBlockKv; j += lanes) {
      const auto distance = hn::Abs(hn::Iota(d, static_cast<float>(j0 + j - alibi.center)));
      hn::StoreU(hn::MulAdd(neg_slope, distance, hn::LoadU(d, s + j)), d, s + j);
    }
  }
}

/// The parts of MaskScoreRow a caller already did for the whole tile.
struct TileMaskDone {
  bool score_mod = false;  // additive terms and score_mod (ScoreModTile)
  bool blocks = false;     // BlockMask: `keep` is exactly its kept keys (FlexRowSupport)
};

/// Masks score row s[0, kBlockKv) = columns [j0, j0 + kBlockKv) of query row i of
/// (b, h), in this order: additive terms (dense float mask, ALiBi), flex score_mod, masks.
/// Keys outside row_columns (band, document, padding) or past kv_len become -inf by
/// filling the row's ends (never per element); the dense bool mask and the BlockMask's
/// partial blocks (mask_mod over SIMD lanes) then mask within; full blocks skip mask_mod.
/// `keep` is row_columns() of row i, or FlexRowSupport's narrowing of it; `mod_input`, when
/// non-null, receives the row as score_mod sees it (for the backward).
HWY_INLINE void MaskScoreRow(const AttentionParams& p, const DenseMaskRows& dense,
                             flex::RowState* flex_state, int64_t b, int64_t h, int64_t i,
                             const ColumnRange& keep, int64_t j0, int64_t cols,
                             float* HWY_RESTRICT s, float* HWY_RESTRICT mod_input = nullptr,
                             TileMaskDone done = {}) {
  const int64_t lo = std::clamp<int64_t>(keep.begin - j0, 0, cols);
  const int64_t hi = std::clamp<int64_t>(keep.end - j0, lo, cols);
  if (!done.score_mod) {
    AddScoreTerms(p, dense, h, i, j0, lo, hi, s);
    if (mod_input) std::copy(s, s + kBlockKv, mod_input);
    if (flex_state && flex_state->score_mod && hi > lo) {
      flex::HWY_NAMESPACE::ApplyScoreMod(*flex_state->score_mod, s, b, h, i, j0, lo, hi);
    }
  }
  std::fill(s, s + lo, kNegInf);
  std::fill(s + hi, s + kBlockKv, kNegInf);
  if (dense.keep_mask()) dense.apply(i, j0 + lo, hi - lo, s + lo);
  if (flex_state && flex_state->blocks.active() && !done.blocks) {
    const int64_t bs = flex_state->blocks.kv_block_size();
    for (int64_t j = lo; j < hi;) {  // one segment per BlockMask block
      const int64_t kb = (j0 + j) / bs;
      const int64_t end = std::min(hi, (kb + 1) * bs - j0);
      const flex::BlockState st = flex_state->blocks.state(b, h, i, kb);
      if (st == flex::BlockState::kEmpty) {
        std::fill(s + j, s + end, kNegInf);
      } else if (st == flex::BlockState::kPartial && flex_state->mask_mod) {
        flex::HWY_NAMESPACE::ApplyMaskMod(*flex_state->mask_mod, s, b, h, i, j0, j, end);
      }
      j = end;
    }
  }
}

/// MaskScoreRow's additive terms and score_mod for the rows of a tile at once (rows
/// q_begin + r, r < rows, with keys keys[r]; scores rows of kBlockKv floats): the
/// score_mod runs one evaluation per chunk of rows instead of one per row.
HWY_INLINE void ScoreModTile(const AttentionParams& p, const DenseMaskRows& dense,
                             flex::RowState& flex_state, int64_t b, int64_t h, int64_t q_begin,
                             int64_t rows, const ColumnRange* keys, int64_t j0, int64_t cols,
                             float* HWY_RESTRICT scores) {
  int64_t lo[kBlockQ], hi[kBlockQ];
  for (int64_t r = 0; r < rows; ++r) {
    lo[r] = std::clamp<int64_t>(keys[r].begin - j0, 0, cols);
    hi[r] = std::clamp<int64_t>(keys[r].end - j0, lo[r], cols);
    AddScoreTerms(p, dense, h, q_begin + r, j0, lo[r], hi[r], scores + r * kBlockKv);
  }
  flex::HWY_NAMESPACE::ApplyScoreModRows(*flex_state.score_mod, scores, kBlockKv, b, h, q_begin,
                                         rows, j0, lo, hi);
}

/// Narrows `keep` (row i's keys, absolute columns) to the hull of the keys the BlockMask
/// keeps in key tile [j0, j0 + cols): empty blocks drop out, full blocks (and partial ones
/// without a mask_mod) count whole, partial blocks count mask_mod's kept lanes. Returns
/// whether every key of the hull is kept, so that the kernel computes and masks only the
/// row's support, as for a native band (causal, window and document masks give intervals).
HWY_INLINE bool FlexRowSupport(flex::RowState& flex_state, int64_t b, int64_t h, int64_t i,
                               int64_t j0, int64_t cols, ColumnRange& keep) {
  const int64_t lo = std::clamp<int64_t>(keep.begin - j0, 0, cols);
  const int64_t hi = std::clamp<int64_t>(keep.end - j0, lo, cols);
  const int64_t bs = flex_state.blocks.kv_block_size();
  int64_t first = hi, last = -1, count = 0;
  for (int64_t j = lo; j < hi;) {  // one segment per BlockMask block
    const int64_t kb = (j0 + j) / bs;
    const int64_t end = std::min(hi, (kb + 1) * bs - j0);
    const flex::BlockState st = flex_state.blocks.state(b, h, i, kb);
    flex::HWY_NAMESPACE::KeptLanes kept{j, end - 1, end - j};
    if (st == flex::BlockState::kEmpty) {
      kept = {};
    } else if (st == flex::BlockState::kPartial && flex_state.mask_mod) {
      kept = flex::HWY_NAMESPACE::CountKeptLanes(*flex_state.mask_mod, b, h, i, j0, j, end);
    }
    if (kept.count > 0) {
      first = std::min(first, kept.first);
      last = kept.last;
      count += kept.count;
    }
    j = end;
  }
  keep = count > 0 ? ColumnRange{j0 + first, j0 + last + 1} : ColumnRange{j0, j0};
  return count == 0 || count == last - first + 1;
}

/// Whether rows with key ranges `ranges[0, rows)` need MaskScoreRow on key tile
/// [j0, j0 + kBlockKv): false when the call has no per-element mask part and every row
/// keeps the whole tile (a full tile: nothing to mask).
HWY_INLINE bool TileNeedsMask(const AttentionParams& p, const flex::RowState* flex_state,
                              const ColumnRange* ranges, int64_t rows, int64_t j0) {
  if (p.mask.dense_kind != DenseMaskKind::kNone || !p.mask.alibi_slopes.empty() ||
      (flex_state && flex_state->active()) || j0 + kBlockKv > p.kv_len) {
    return true;
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (ranges[r].begin > j0 || ranges[r].end < j0 + kBlockKv) return true;
  }
  return false;
}

/// exp(x) for softmax arguments (x <= ~0): 2^(x log2 e) by a degree-6 Taylor polynomial
/// of 2^f on f in [-0.5, 0.5] (relative error < 2e-7) and the exponent by bit shifting;
/// exactly 0 below -87 (so -inf, a masked score, gives 0). Cheaper than a general exp,
/// which matters because the softmax shares the FMA ports with the GEMMs.
template <class D, class V>
HWY_INLINE V FastExp(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V t = hn::Min(hn::Max(hn::Mul(x, hn::Set(d, 1.44269504088896341f)), hn::Set(d, -126.0f)),
                      hn::Set(d, 127.0f));
  const V n = hn::Round(t);
  const V f = hn::Sub(t, n);
  V poly = hn::Set(d, 1.5403530393381606e-4f);
  poly = hn::MulAdd(poly, f, hn::Set(d, 1.3333558146428443e-3f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 9.6181291076284772e-3f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 5.5504108664821580e-2f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 2.4022650695910071e-1f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 6.9314718055994531e-1f));
  poly = hn::MulAdd(poly, f, hn::Set(d, 1.0f));
  const auto exponent = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  const V result = hn::Mul(poly, hn::BitCast(d, exponent));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.0f)), result);
}

/// row[0, n) *= factor; n a multiple of the vector width.
HWY_INLINE void ScaleRow(float* HWY_RESTRICT row, int64_t n, float factor) {
  const hn::ScalableTag<float> d;
  const auto f = hn::Set(d, factor);
  for (int64_t j = 0; j < n; j += static_cast<int64_t>(hn::Lanes(d))) {
    hn::StoreU(hn::Mul(hn::LoadU(d, row + j), f), d, row + j);
  }
}

/// Online-softmax update of one score row (Milakov & Gimelshein 2018; FlashAttention-2):
/// turns scores into unnormalized probabilities relative to the new running max, rescales
/// the running sum and returns the factor the output accumulator must be scaled by.
/// Only columns [begin, end) can hold finite scores (the row's support in this tile; the
/// rest is -inf): the work covers the vectors spanning them and the rest is zeroed.
/// Returns 1 and leaves the row all zero when the row has no finite score yet.
HWY_INLINE float SoftmaxRowUpdate(float* HWY_RESTRICT s, int64_t begin, int64_t end, float& row_max,
                                  float& row_sum) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t first = begin / lanes * lanes;
  const int64_t last = std::max(first, (end + lanes - 1) / lanes * lanes);
  auto vmax = hn::Set(d, kNegInf);
  for (int64_t j = first; j < last; j += lanes) vmax = hn::Max(vmax, hn::LoadU(d, s + j));
  const float tile_max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float new_max = std::max(row_max, tile_max);
  std::fill(s, s + first, 0.0f);
  std::fill(s + last, s + kBlockKv, 0.0f);
  if (new_max == kNegInf) {
    std::fill(s + first, s + last, 0.0f);
    return 1.0f;
  }
  const auto vnew_max = hn::Set(d, new_max);
  // FastExp, not std::exp: the libm call per row and tile took 2% of a windowed call's profile.
  const float alpha =
      row_max == kNegInf ? 0.0f : hn::GetLane(FastExp(d, hn::Set(d, row_max - new_max)));
  auto vsum = hn::Zero(d);
  for (int64_t j = first; j < last; j += lanes) {
    // FastExp returns exactly 0 for -inf (masked) scores.
    const auto e = FastExp(d, hn::Sub(hn::LoadU(d, s + j), vnew_max));
    hn::StoreU(e, d, s + j);
    vsum = hn::Add(vsum, e);
  }
  row_sum = row_sum * alpha + hn::GetLane(hn::SumOfLanes(d, vsum));
  row_max = new_max;
  return alpha;
}

/// The key tiles [first, end) (multiples of kBlockKv from first) that any of query rows
/// [row_begin, row_end) of (b, h) can see (band, documents, padding, BlockMask).
struct KvTileRange {
  int64_t first = 0;
  int64_t end = 0;
};
HWY_INLINE KvTileRange VisibleKvTiles(const AttentionParams& p, flex::RowState* flex_state,
                                      int64_t b, int64_t h, int64_t row_begin, int64_t row_end) {
  ColumnRange span = block_columns(p.mask, b, row_begin, row_end, p.q_len, p.kv_len);
  if (flex_state && flex_state->blocks.active()) {
    const auto [lo, hi] = flex_state->blocks.columns(b, h, row_begin, row_end);
    span = {std::max(span.begin, lo), std::min(span.end, hi)};
  }
  if (span.empty()) return {};
  return {span.begin / kBlockKv * kBlockKv, span.end};
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_TILE_OPS_INL_H_
