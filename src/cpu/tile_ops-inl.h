// Score-row masking (biases, score_mod, masks, BlockMask) and the visible key tiles, shared by
// the CPU flash forward, decode and backward. Per-target code: include after foreach_target.h.

#if defined(SDPA_CPU_TILE_OPS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_TILE_OPS_INL_H_
#undef SDPA_CPU_TILE_OPS_INL_H_
#else
#define SDPA_CPU_TILE_OPS_INL_H_
#endif

#include <algorithm>
#include <bit>
#include <cstdint>

#include "core/kernel_inline.h"
#include "cpu/flash_tile.h"
#include "cpu/gemm-inl.h"
#include "cpu/kernel_context.h"
#include "cpu/mask_rows.h"
#include "cpu/online_softmax-inl.h"
#include "cpu/pack.h"
#include "cpu/rows.h"
#include "flex/eval_row-inl.h"
#include "flex/partial_bits-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// s[j] -= slope * |offset + j| for j in [0, kBlockKv): the ALiBi bias of a score row whose
/// first key lies `offset` keys from the row's diagonal. The distances are integers held
/// exactly in float and advanced by one addition per vector.
SDPA_INLINE void AddAlibiRow(float* HWY_RESTRICT s, float slope, int64_t offset) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto neg_slope = hn::Set(d, -slope);
  const auto step = hn::Set(d, static_cast<float>(lanes));
  auto position = hn::Iota(d, static_cast<float>(offset));
  for (int64_t j = 0; j < kBlockKv; j += lanes) {
    hn::StoreU(hn::MulAdd(neg_slope, hn::Abs(position), hn::LoadU(d, s + j)), d, s + j);
    position = hn::Add(position, step);
  }
}

/// Row i's kept keys `keep` (absolute columns) in key tile [j0, j0 + cols).
struct KeyTileRow {
  int64_t i;
  ColumnRange keep;
  int64_t j0;
  int64_t cols;

  /// The kept keys as lanes [lo, hi) of the tile row.
  struct Lanes {
    int64_t lo, hi;
  };
  Lanes lanes() const {
    const int64_t lo = std::clamp<int64_t>(keep.begin - j0, 0, cols);
    return {lo, std::clamp<int64_t>(keep.end - j0, lo, cols)};
  }
};

/// Query rows [q_begin, q_begin + rows) in key tile [j0, j0 + cols), row r keeping keys[r].
struct KeyTileRows {
  int64_t q_begin;
  int64_t rows;
  const ColumnRange* keys;
  int64_t j0;
  int64_t cols;

  KeyTileRow row(int64_t r) const { return {q_begin + r, keys[r], j0, cols}; }
};

/// Adds the ALiBi bias to rows [0, rows) of a score tile (rows of kBlockKv floats) in one
/// pass, so that tiles which need no masking otherwise skip MaskScoreRow. Lanes outside a
/// row's keys get a bias too; MaskScoreRow overwrites them when the tile needs masking.
SDPA_INLINE void AlibiTile(const HeadMasking& m, const KeyTileRows& tile,
                           float* HWY_RESTRICT scores) {
  const AlibiRow first = alibi_row(m.mask, m.h, tile.q_begin, m.q_len, m.kv_len);
  for (int64_t r = 0; r < tile.rows; ++r) {
    AddAlibiRow(scores + r * kBlockKv, first.slope, tile.j0 - (first.center + r));
  }
}

/// Adds the additive terms (dense float mask over the row's kept lanes [lo, hi) =
/// row.lanes(), ALiBi unless `alibi_done`) to score row s of `row`.
SDPA_INLINE void AddScoreTerms(const HeadMasking& m, const KeyTileRow& row, KeyTileRow::Lanes kept,
                               float* HWY_RESTRICT s, bool alibi_done) {
  const auto [lo, hi] = kept;
  if (m.dense.additive()) m.dense.apply(row.i, row.j0 + lo, hi - lo, s + lo);
  const AlibiRow alibi = alibi_row(m.mask, m.h, row.i, m.q_len, m.kv_len);
  // Lanes outside [lo, hi) are masked afterwards.
  if (alibi.active && !alibi_done) AddAlibiRow(s, alibi.slope, row.j0 - alibi.center);
}

/// The parts of MaskScoreRow a caller already did for the whole tile.
struct TileMaskDone {
  bool score_mod = false;  // additive terms and score_mod (ScoreModTile)
  bool blocks = false;     // BlockMask: `keep` is exactly its kept keys (FlexRowSupport)
  bool alibi = false;      // the ALiBi bias (AlibiTile)
};

/// Masks score row s[0, kBlockKv) = columns [j0, j0 + kBlockKv) of `row`, in this order:
/// additive terms (dense float mask, ALiBi), flex score_mod, masks. Keys outside row.keep
/// (band, document, padding) or past kv_len become -inf by filling the row's ends (never
/// per element); the dense bool mask and the BlockMask's partial blocks (mask_mod over
/// SIMD lanes) then mask within; full blocks skip mask_mod. row.keep is row_columns() of
/// the row, or FlexRowSupport's narrowing of it; `mod_input`, when non-null, receives the
/// row as score_mod sees it (for the backward).
SDPA_INLINE void MaskScoreRow(const HeadMasking& m, const KeyTileRow& row, float* HWY_RESTRICT s,
                              float* HWY_RESTRICT mod_input = nullptr, TileMaskDone done = {}) {
  const KeyTileRow::Lanes kept = row.lanes();
  const auto [lo, hi] = kept;
  const flex::HWY_NAMESPACE::EvalSite site{m.b, m.h, row.i, 1, row.j0};
  flex::RowState* flex_state = m.flex;
  if (!done.score_mod) {
    AddScoreTerms(m, row, kept, s, done.alibi);
    if (mod_input) std::copy(s, s + kBlockKv, mod_input);
    if (flex_state && flex_state->score_mod && hi > lo) {
      flex::HWY_NAMESPACE::ApplyScoreMod(*flex_state->score_mod, site, s, lo, hi);
    }
  }
  std::fill(s, s + lo, kNegInf);
  std::fill(s + hi, s + kBlockKv, kNegInf);
  if (m.dense.keep_mask()) m.dense.apply(row.i, row.j0 + lo, hi - lo, s + lo);
  if (flex_state && flex_state->blocks.active() && !done.blocks) {
    const int64_t bs = flex_state->blocks.kv_block_size();
    for (int64_t j = lo; j < hi;) {  // one segment per BlockMask block
      const int64_t kb = (row.j0 + j) / bs;
      const int64_t end = std::min(hi, (kb + 1) * bs - row.j0);
      const flex::BlockState st = flex_state->blocks.state(m.b, m.h, row.i, kb);
      if (st == flex::BlockState::kEmpty) {
        std::fill(s + j, s + end, kNegInf);
      } else if (st == flex::BlockState::kPartial && flex_state->mask_mod) {
        flex::HWY_NAMESPACE::PartialMaskRow(*flex_state, site, kb, s, j, end);
      }
      j = end;
    }
  }
}

/// MaskScoreRow's additive terms and score_mod for the rows of a tile at once (scores rows
/// of kBlockKv floats): the score_mod runs one evaluation per chunk of rows instead of one
/// per row. `alibi_done`: AlibiTile already added the ALiBi bias. m.flex has a score_mod.
SDPA_INLINE void ScoreModTile(const HeadMasking& m, const KeyTileRows& tile,
                              float* HWY_RESTRICT scores, bool alibi_done) {
  int64_t lo[kBlockQ], hi[kBlockQ];
  for (int64_t r = 0; r < tile.rows; ++r) {
    const KeyTileRow row = tile.row(r);
    const KeyTileRow::Lanes kept = row.lanes();
    lo[r] = kept.lo;
    hi[r] = kept.hi;
    AddScoreTerms(m, row, kept, scores + r * kBlockKv, alibi_done);
  }
  flex::HWY_NAMESPACE::ApplyScoreModRows(
      *m.flex->score_mod, {m.b, m.h, tile.q_begin, tile.rows, tile.j0},
      flex::HWY_NAMESPACE::ScoreLanes<float>{scores, kBlockKv, lo, hi});
}

/// Narrows row.keep to the hull of the keys the BlockMask (m.flex's, active) keeps in the
/// row's key tile: empty blocks drop out, full blocks (and partial ones without a
/// mask_mod) count whole, partial blocks count mask_mod's kept lanes. Returns whether every
/// key of the hull is kept, so that the kernel computes and masks only the row's support,
/// as for a native band (causal, window and document masks give intervals).
SDPA_INLINE bool FlexRowSupport(const HeadMasking& m, KeyTileRow& row) {
  const auto [lo, hi] = row.lanes();
  const int64_t j0 = row.j0;
  flex::RowState& flex_state = *m.flex;
  const int64_t bs = flex_state.blocks.kv_block_size();
  const flex::HWY_NAMESPACE::EvalSite site{m.b, m.h, row.i, 1, j0};
  int64_t first = hi, last = -1, count = 0;
  for (int64_t j = lo; j < hi;) {  // one segment per BlockMask block
    const int64_t kb = (j0 + j) / bs;
    const int64_t end = std::min(hi, (kb + 1) * bs - j0);
    const flex::BlockState st = flex_state.blocks.state(m.b, m.h, row.i, kb);
    flex::HWY_NAMESPACE::KeptLanes kept{j, end - 1, end - j};
    if (st == flex::BlockState::kEmpty) {
      kept = {};
    } else if (st == flex::BlockState::kPartial && flex_state.mask_mod) {
      kept = flex::HWY_NAMESPACE::PartialKeptLanes(flex_state, site, kb, j, end);
    }
    if (kept.count > 0) {
      first = std::min(first, kept.first);
      last = kept.last;
      count += kept.count;
    }
    j = end;
  }
  row.keep = count > 0 ? ColumnRange{j0 + first, j0 + last + 1} : ColumnRange{j0, j0};
  return count == 0 || count == last - first + 1;
}

/// FlexRowSupport for every row of `tile` (keys[r]: row r's keep, narrowed in place;
/// applied[r]: FlexRowSupport's result) where all of them lie in one BlockMask block (rows
/// in one q block, keys in one kv block): one block lookup instead of one per row, and a
/// partial block's rows read as words of the call's shared bits. Returns false, changing
/// nothing, where that does not hold or the bits cannot be read; else sets `any_key`.
SDPA_INLINE bool FlexTileSupport(const HeadMasking& m, const KeyTileRows& tile, ColumnRange* keys,
                                 bool* applied, bool& any_key) {
  static_assert(kBlockKv <= flex::PartialBlockBits::kWordKeys, "a key tile row is one word");
  flex::RowState& st = *m.flex;
  const int64_t q_block = st.blocks.q_block_size(), kv_block = st.blocks.kv_block_size();
  const int64_t qb = tile.q_begin / q_block, kb = tile.j0 / kv_block;
  if ((tile.q_begin + tile.rows - 1) / q_block != qb || (tile.j0 + tile.cols - 1) / kv_block != kb) {
    return false;
  }
  const flex::BlockState state = st.blocks.state(m.b, m.h, tile.q_begin, kb);
  const uint64_t* words = nullptr;
  int64_t stride = 0;
  if (state == flex::BlockState::kPartial && st.mask_mod) {
    const flex::HWY_NAMESPACE::EvalSite site{m.b, m.h, tile.q_begin, 1, tile.j0};
    words = flex::HWY_NAMESPACE::SharedPartialWord(st, site, kb, tile.cols);
    if (words == nullptr) return false;
    stride = st.partial_bits->words_per_row();
  }
  any_key = false;
  for (int64_t r = 0; r < tile.rows; ++r) {
    const auto [lo, hi] = tile.row(r).lanes();
    uint64_t kept = 0;
    if (state != flex::BlockState::kEmpty && hi > lo) {
      kept = flex::HWY_NAMESPACE::LaneRange(words ? words[r * stride] : ~uint64_t{0}, lo, hi);
    }
    if (kept == 0) {
      keys[r] = {tile.j0, tile.j0};
      applied[r] = true;
      continue;
    }
    const int64_t first = std::countr_zero(kept), last = 63 - std::countl_zero(kept);
    keys[r] = {tile.j0 + first, tile.j0 + last + 1};
    applied[r] = std::popcount(kept) == last - first + 1;
    any_key = true;
  }
  return true;
}

/// Whether rows with key ranges `ranges[0, rows)` need MaskScoreRow on key tile
/// [j0, j0 + kBlockKv): false when the call has no per-element mask part other than ALiBi
/// (which the caller adds with AlibiTile) and every row keeps the whole tile (a full tile:
/// nothing to mask).
SDPA_INLINE bool TileNeedsMask(const AttentionParams& p, const flex::RowState* flex_state,
                               const ColumnRange* ranges, int64_t rows, int64_t j0) {
  if (p.mask.dense_kind != DenseMaskKind::kNone || (flex_state && flex_state->active()) ||
      j0 + kBlockKv > p.kv_len) {
    return true;
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (ranges[r].begin > j0 || ranges[r].end < j0 + kBlockKv) return true;
  }
  return false;
}

/// The key tiles [first, end) (multiples of kBlockKv from first) that any of the rows of
/// `q` can see (band, documents, padding, BlockMask).
struct KvTileRange {
  int64_t first = 0;
  int64_t end = 0;
};
SDPA_INLINE KvTileRange VisibleKvTiles(const AttentionParams& p, flex::RowState* flex_state,
                                       const QueryTile& q) {
  const int64_t b = q.b, h = q.h, row_begin = q.q_begin, row_end = q.q_begin + q.rows;
  ColumnRange span = block_columns(p, b, row_begin, row_end);
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
