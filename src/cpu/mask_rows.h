#pragma once
// Row-wise application of the native mask descriptor: the band as a column interval per
// query row, the dense tensor as a strided row read. Shared by MATH and FLASH so both
// mask exactly the same elements.

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/element_access.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// Half-open interval of key columns.
struct ColumnRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return begin >= end; }
};

/// Columns of query row i that the band keeps, clipped to [0, kv_len).
inline ColumnRange band_columns(const MaskDescriptor& mask, int64_t i, int64_t q_len,
                                int64_t kv_len) {
  if (!mask.band) return {0, kv_len};
  const DiagonalBand& b = *mask.band;
  const int64_t diag = i + MaskDescriptor::diagonal_offset(b, q_len, kv_len);
  const int64_t lo = b.left ? diag - *b.left : 0;
  const int64_t hi = b.right ? diag + *b.right + 1 : kv_len;
  return {std::clamp<int64_t>(lo, 0, kv_len), std::clamp<int64_t>(hi, 0, kv_len)};
}

/// Columns kept by the band for any row of [row_begin, row_end): the union of their
/// intervals (bands are monotone in the row, so the ends suffice).
inline ColumnRange band_columns_for_rows(const MaskDescriptor& mask, int64_t row_begin,
                                         int64_t row_end, int64_t q_len, int64_t kv_len) {
  const ColumnRange first = band_columns(mask, row_begin, q_len, kv_len);
  const ColumnRange last = band_columns(mask, row_end - 1, q_len, kv_len);
  return {first.begin, last.end};
}

/// Reads the dense mask of one (batch, head) and applies it to score rows.
class DenseMaskRows {
 public:
  DenseMaskRows(const MaskDescriptor& mask, int64_t b, int64_t h) : kind_(mask.dense_kind) {
    if (kind_ == DenseMaskKind::kNone) return;
    const Tensor& t = mask.dense;
    dtype_ = t.dtype();
    base_ = static_cast<const char*>(t.data_ptr()) +
            (b * t.stride(0) + h * t.stride(1)) * static_cast<int64_t>(element_size(dtype_));
    stride_row_ = t.stride(2);
    stride_col_ = t.stride(3);
  }

  bool active() const { return kind_ != DenseMaskKind::kNone; }

  /// Applies the mask to scores s[0, n) = columns [col, col + n) of query row i:
  /// bool false -> -inf, float -> added.
  template <typename T>
  void apply(int64_t i, int64_t col, int64_t n, T* s) const {
    if (kind_ == DenseMaskKind::kNone) return;
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

}  // namespace sdpa::cpu
