// Tile packing and masking shared by the CPU flash forward and backward. Per-target
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
#include "cpu/rows.h"
#include "flex/eval_row-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// dst[c * ld + e] = rows[first + c][e] * multiplier for c < count, e < dim; columns
/// [dim, ld) are zeroed so padded GEMM lanes read zeros.
HWY_INLINE void PackRows(const RowView& rows, int64_t first, int64_t count, int64_t dim,
                         int64_t ld, float* HWY_RESTRICT dst, float multiplier = 1.0f) {
  for (int64_t c = 0; c < count; ++c) {
    float* row = dst + c * ld;
    rows.load(first + c, row, multiplier);
    std::fill(row + dim, row + ld, 0.0f);
  }
}

/// Transposed pack of a key-like tile: dst[e * kBlockKv + c] = rows[first + c][e] for
/// c < count, zero for count <= c < kBlockKv. `row_tmp` holds one converted row.
HWY_INLINE void PackTransposed(const RowView& rows, int64_t first, int64_t count, int64_t dim,
                               float* HWY_RESTRICT dst, float* HWY_RESTRICT row_tmp) {
  for (int64_t c = 0; c < count; ++c) {
    rows.load(first + c, row_tmp);
    for (int64_t e = 0; e < dim; ++e) dst[e * kBlockKv + c] = row_tmp[e];
  }
  for (int64_t e = 0; e < dim; ++e) {
    std::fill(dst + e * kBlockKv + count, dst + (e + 1) * kBlockKv, 0.0f);
  }
}

/// Masks score row s[0, kBlockKv) = columns [j0, j0 + kBlockKv) of query row i of
/// (b, h), in this order: additive terms (dense float mask, ALiBi), flex score_mod, masks.
/// Keys outside row_columns (band, document, padding) or past kv_len become -inf by
/// filling the row's ends (never per element); the dense bool mask and the BlockMask's
/// partial blocks (mask_mod over SIMD lanes) then mask within; full blocks skip mask_mod.
/// `mod_input`, when non-null, receives the row as score_mod sees it (for the backward).
HWY_INLINE void MaskScoreRow(const AttentionParams& p, const DenseMaskRows& dense,
                             flex::RowState* flex_state, int64_t b, int64_t h, int64_t i,
                             int64_t j0, int64_t cols, float* HWY_RESTRICT s,
                             float* HWY_RESTRICT mod_input = nullptr) {
  const ColumnRange keep = row_columns(p.mask, b, i, p.q_len, p.kv_len);
  const int64_t lo = std::clamp<int64_t>(keep.begin - j0, 0, cols);
  const int64_t hi = std::clamp<int64_t>(keep.end - j0, lo, cols);
  if (dense.additive()) dense.apply(i, j0 + lo, hi - lo, s + lo);
  const AlibiRow alibi = alibi_row(p.mask, h, i, p.q_len, p.kv_len);
  if (alibi.active) {
    // s[j] -= slope * |j0 + j - center|; lanes outside [lo, hi) are masked below.
    const hn::ScalableTag<float> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto neg_slope = hn::Set(d, -alibi.slope);
    for (int64_t j = 0; j < kBlockKv; j += lanes) {
      const auto distance = hn::Abs(hn::Iota(d, static_cast<float>(j0 + j - alibi.center)));
      hn::StoreU(hn::MulAdd(neg_slope, distance, hn::LoadU(d, s + j)), d, s + j);
    }
  }
  if (mod_input) std::copy(s, s + kBlockKv, mod_input);
  if (flex_state && flex_state->score_mod && hi > lo) {
    flex::HWY_NAMESPACE::ApplyScoreMod(*flex_state->score_mod, s + lo, b, h, i, j0 + lo, hi - lo);
  }
  std::fill(s, s + lo, kNegInf);
  std::fill(s + hi, s + kBlockKv, kNegInf);
  if (dense.keep_mask()) dense.apply(i, j0 + lo, hi - lo, s + lo);
  if (flex_state && flex_state->blocks.active()) {
    const int64_t bs = flex_state->blocks.kv_block_size();
    for (int64_t j = lo; j < hi;) {  // one segment per BlockMask block
      const int64_t kb = (j0 + j) / bs;
      const int64_t end = std::min(hi, (kb + 1) * bs - j0);
      const flex::BlockState st = flex_state->blocks.state(b, h, i, kb);
      if (st == flex::BlockState::kEmpty) {
        std::fill(s + j, s + end, kNegInf);
      } else if (st == flex::BlockState::kPartial && flex_state->mask_mod) {
        flex::HWY_NAMESPACE::ApplyMaskMod(*flex_state->mask_mod, s + j, b, h, i, j0 + j, end - j);
      }
      j = end;
    }
  }
}

/// row[0, n) *= factor; n a multiple of the vector width.
HWY_INLINE void ScaleRow(float* HWY_RESTRICT row, int64_t n, float factor) {
  const hn::ScalableTag<float> d;
  const auto f = hn::Set(d, factor);
  for (int64_t j = 0; j < n; j += static_cast<int64_t>(hn::Lanes(d))) {
    hn::StoreU(hn::Mul(hn::LoadU(d, row + j), f), d, row + j);
  }
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
