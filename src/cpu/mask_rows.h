#pragma once
// Row-wise application of the native mask descriptor: the band as a column interval per
// query row, the dense tensor as a strided row read. Shared by MATH and FLASH so both
// mask exactly the same elements.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/element_access.h"
#include "core/saturating.h"
#include "flex/row_state.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// Half-open interval of key columns.
struct ColumnRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return begin >= end; }
};

/// The document a query row belongs to (packed varlen), or the whole sequence.
struct RowDocument {
  int64_t q_begin = 0;
  int64_t q_len = 0;
  int64_t kv_begin = 0;
  int64_t kv_len = 0;
};

inline RowDocument row_document(const MaskDescriptor& mask, int64_t i, int64_t q_len,
                                int64_t kv_len) {
  if (!mask.has_documents()) return {0, q_len, 0, kv_len};
  const auto& cq = mask.cu_seqlens_q;
  // Last document starting at or before i (empty documents are skipped over).
  const int64_t doc = std::upper_bound(cq.begin(), cq.end(), i) - cq.begin() - 1;
  const int64_t d = std::clamp<int64_t>(doc, 0, static_cast<int64_t>(cq.size()) - 2);
  return {cq[d], cq[d + 1] - cq[d], mask.cu_seqlens_kv[d],
          mask.cu_seqlens_kv[d + 1] - mask.cu_seqlens_kv[d]};
}

/// Keys query row i of batch b may see: the intersection of its document, the batch's
/// valid keys and every band (each in its own frame), clipped to [0, kv_len). The dense
/// mask is not included (it is per element).
inline ColumnRange row_columns(const MaskDescriptor& mask, int64_t b, int64_t i, int64_t q_len,
                               int64_t kv_len) {
  const RowDocument doc = row_document(mask, i, q_len, kv_len);
  const int64_t valid = mask.kv_lengths.empty() ? kv_len : mask.kv_lengths[b];
  int64_t lo = doc.kv_begin, hi = std::min(doc.kv_begin + doc.kv_len, valid);
  for (const DiagonalBand& band : mask.bands) {
    int64_t row = i, rows = q_len, cols = kv_len, origin = 0;
    if (band.frame == BandFrame::kDocument) {
      row = i - doc.q_begin;
      rows = doc.q_len;
      cols = doc.kv_len;
      origin = doc.kv_begin;
    } else if (band.frame == BandFrame::kValidKeys) {
      cols = valid;
    }
    const int64_t diag =
        origin + row + (band.alignment == DiagonalAlignment::kBottomRight ? cols - rows : 0);
    if (band.left) lo = std::max(lo, detail::saturating_sub(diag, *band.left));
    if (band.right) {
      hi = std::min(hi, detail::saturating_add(detail::saturating_add(diag, *band.right), 1));
    }
  }
  lo = std::clamp<int64_t>(lo, 0, kv_len);
  return {lo, std::clamp<int64_t>(hi, lo, kv_len)};
}

/// Union of row_columns over rows [row_begin, row_end): the key range a q-block can see.
inline ColumnRange block_columns(const AttentionParams& p, int64_t b, int64_t row_begin,
                                 int64_t row_end) {
  ColumnRange all{p.kv_len, 0};
  for (int64_t i = row_begin; i < row_end; ++i) {
    const ColumnRange r = row_columns(p.mask, b, i, p.q_len, p.kv_len);
    if (r.empty()) continue;
    all.begin = std::min(all.begin, r.begin);
    all.end = std::max(all.end, r.end);
  }
  return all.empty() ? ColumnRange{} : all;
}

/// ALiBi term of one (head, query row): bias(j) = -slope * |center - j|.
struct AlibiRow {
  float slope = 0.0f;
  int64_t center = 0;
  bool active = false;
};

inline AlibiRow alibi_row(const MaskDescriptor& mask, int64_t h, int64_t i, int64_t q_len,
                          int64_t kv_len) {
  if (mask.alibi_slopes.empty()) return {};
  const int64_t d = mask.alibi_alignment == DiagonalAlignment::kBottomRight ? kv_len - q_len : 0;
  return {mask.alibi_slopes[h], i + d, true};
}

/// Reads the dense mask of one (batch, head) and applies it to score rows.
class DenseMaskRows {
 public:
  DenseMaskRows(const MaskDescriptor& mask, int64_t b, int64_t h) : kind_(mask.dense_kind) {
    if (kind_ == DenseMaskKind::kNone) return;
    const Tensor& t = mask.dense;
    dtype_ = t.dtype();
    // An empty mask has no address to offset (apply then never reads it).
    base_ = t.data_ptr() == nullptr
                ? nullptr
                : static_cast<const char*>(t.data_ptr()) +
                      (b * t.stride(0) + h * t.stride(1)) * static_cast<int64_t>(element_size(dtype_));
    stride_row_ = t.stride(2);
    stride_col_ = t.stride(3);
  }

  bool active() const { return kind_ != DenseMaskKind::kNone; }
  bool additive() const { return kind_ == DenseMaskKind::kAdditive; }
  bool keep_mask() const { return kind_ == DenseMaskKind::kBoolKeep; }

  /// Applies the mask to scores s[0, n) = columns [col, col + n) of query row i:
  /// bool false -> -inf, float -> added.
  template <typename T>
  void apply(int64_t i, int64_t col, int64_t n, T* s) const {
    if (kind_ == DenseMaskKind::kNone || n <= 0) return;
    const int64_t first = i * stride_row_ + col * stride_col_;
    if (kind_ == DenseMaskKind::kBoolKeep) {
      const bool* m = reinterpret_cast<const bool*>(base_) + first;
      for (int64_t j = 0; j < n; ++j) {
        if (!m[j * stride_col_]) s[j] = -std::numeric_limits<T>::infinity();
      }
      return;
    }
    for (int64_t j = 0; j < n; ++j) {
      s[j] += static_cast<T>(detail::load_element(base_, dtype_, first + j * stride_col_));
    }
  }

 private:
  DenseMaskKind kind_;
  DType dtype_ = DType::kBool;
  const char* base_ = nullptr;
  int64_t stride_row_ = 0;
  int64_t stride_col_ = 0;
};

/// What masks the score rows of one (batch b, query head h): the call's mask, its dense
/// mask rows of (b, h), the flex state (null without flex), and the call's q_len / kv_len.
struct HeadMasking {
  const MaskDescriptor& mask;
  const DenseMaskRows& dense;
  flex::RowState* flex;
  int64_t b, h, q_len, kv_len;
};

/// Applies every part of the mask to the scores of query row i at key columns
/// [col_begin, col_end), held at s[0, col_end - col_begin), in the order FLASH uses per
/// tile (tile_ops-inl.h): additive terms (dense float mask, ALiBi), then the flex
/// score_mod, then the masks (row interval, dense bool mask, BlockMask and its mask_mod).
/// The scalar float64-capable form used by MATH and the float64 flash kernels.
/// `mod_input`, when non-null, receives the scores as score_mod sees them (for the
/// backward), at the same positions.
template <typename T>
void mask_score_cols(const HeadMasking& m, int64_t i, int64_t col_begin, int64_t col_end, T* s,
                     T* mod_input = nullptr) {
  const MaskDescriptor& mask = m.mask;
  const DenseMaskRows& dense = m.dense;
  flex::RowState* flex_state = m.flex;
  const int64_t b = m.b, h = m.h, q_len = m.q_len, kv_len = m.kv_len;
  const ColumnRange row = row_columns(mask, b, i, q_len, kv_len);
  const int64_t n = col_end - col_begin;
  const int64_t lo = std::clamp(row.begin, col_begin, col_end) - col_begin;
  const int64_t hi = std::clamp(row.end, col_begin + lo, col_end) - col_begin;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  if (dense.additive()) dense.apply(i, col_begin + lo, hi - lo, s + lo);
  const AlibiRow alibi = alibi_row(mask, h, i, q_len, kv_len);
  if (alibi.active) {
    for (int64_t j = lo; j < hi; ++j) {
      s[j] -= static_cast<T>(alibi.slope) * static_cast<T>(std::abs(alibi.center - col_begin - j));
    }
  }
  if (mod_input) std::copy(s, s + n, mod_input);
  if (flex_state && flex_state->score_mod) {
    flex::ScalarEvaluator& eval = flex_state->score_mod->scalar;
    for (int64_t j = lo; j < hi; ++j) {
      s[j] = static_cast<T>(eval.run(static_cast<double>(s[j]), b, h, i, col_begin + j));
    }
  }
  for (int64_t j = 0; j < lo; ++j) s[j] = neg_inf;
  for (int64_t j = hi; j < n; ++j) s[j] = neg_inf;
  if (dense.keep_mask()) dense.apply(i, col_begin + lo, hi - lo, s + lo);
  if (flex_state && flex_state->blocks.active()) {
    const int64_t bs = flex_state->blocks.kv_block_size();
    for (int64_t j = lo; j < hi; ++j) {
      const int64_t col = col_begin + j;
      const flex::BlockState st = flex_state->blocks.state(b, h, i, col / bs);
      const bool kept = st == flex::BlockState::kFull ||
                        (st == flex::BlockState::kPartial &&
                         (!flex_state->mask_mod || flex_state->mask_mod->scalar.run(0.0, b, h, i, col) != 0.0));
      if (!kept) s[j] = neg_inf;
    }
  }
}

/// mask_score_cols over a full score row s[0, kv_len).
template <typename T>
void mask_score_row(const HeadMasking& m, int64_t i, T* s, T* mod_input = nullptr) {
  mask_score_cols(m, i, 0, m.kv_len, s, mod_input);
}

}  // namespace sdpa::cpu
