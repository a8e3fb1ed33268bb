#pragma once
// bfloat16 rows copied bit for bit into the layouts of bf16_dot.h's vdpbf16ps GEMMs:
// plain rows (an A operand), pairs over the head dim (k^T or v^T as a B operand) and
// pairs over the rows (v, k, q or dO as a B operand whose depth runs over rows).

#include <algorithm>
#include <cstdint>

#include "cpu/rows.h"

namespace sdpa::cpu {

/// dst[c * ld + e] = rows[first + c][e] for c < count, e < dim; zero for dim <= e < ld.
/// `rows` holds bfloat16.
inline void pack_bf16_rows(const RowView& rows, int64_t first, int64_t count, int64_t dim,
                           int64_t ld, uint16_t* dst) {
  for (int64_t c = 0; c < count; ++c) {
    const uint16_t* src = static_cast<const uint16_t*>(rows.row_data(first + c));
    uint16_t* row = dst + c * ld;
    for (int64_t e = 0; e < dim; ++e) row[e] = src[e * rows.col_stride()];
    std::fill(row + dim, row + ld, uint16_t{0});
  }
}

/// Pairs over the head dim, [round_up(dim, 2) / 2][n][2]: element e of row first + c at
/// dst[(e / 2) * 2 n + 2 c + e % 2] for c < n; zero where c >= count or e >= dim.
inline void pack_bf16_dim_pairs(const RowView& rows, int64_t first, int64_t count, int64_t dim,
                                int64_t n, uint16_t* dst) {
  const int64_t dim2 = dim + dim % 2;
  std::fill(dst, dst + dim2 * n, uint16_t{0});
  for (int64_t c = 0; c < count; ++c) {
    const uint16_t* src = static_cast<const uint16_t*>(rows.row_data(first + c));
    for (int64_t e = 0; e < dim; ++e) {
      dst[(e / 2) * 2 * n + 2 * c + e % 2] = src[e * rows.col_stride()];
    }
  }
}

/// Pairs over the rows, [round_up(count, 2) / 2][ld][2]: element e of row first + c at
/// dst[(c / 2) * 2 ld + 2 e + c % 2]; zero where e >= dim and in the odd count's last pair.
inline void pack_bf16_row_pairs(const RowView& rows, int64_t first, int64_t count, int64_t dim,
                                int64_t ld, uint16_t* dst) {
  std::fill(dst, dst + (count + count % 2) * ld, uint16_t{0});
  for (int64_t c = 0; c < count; ++c) {
    const uint16_t* src = static_cast<const uint16_t*>(rows.row_data(first + c));
    uint16_t* pair = dst + (c / 2) * 2 * ld + c % 2;
    for (int64_t e = 0; e < dim; ++e) pair[2 * e] = src[e * rows.col_stride()];
  }
}

}  // namespace sdpa::cpu
