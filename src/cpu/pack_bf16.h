#pragma once
// bfloat16 rows copied bit for bit into the layouts of bf16_dot.h's vdpbf16ps GEMMs:
// plain rows (an A operand), pairs over the head dim (k^T or v^T as a B operand) and
// pairs over the rows (v, k, q or dO as a B operand whose depth runs over rows).
//
// Rows with unit column stride take AVX-512 paths (16 x 16 transposes of element pairs,
// vpermt2w interleaves of row pairs); only the vdpbf16ps kernels pack into these layouts,
// and their CPUs have AVX-512BW. Other strides copy element by element.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/matrix_view.h"
#include "cpu/rows.h"

namespace sdpa::cpu {

/// The first `elements` (< 32) bf16 lanes of a vector, as a mask.
inline __mmask32 FirstBf16Lanes(int64_t elements) {
  return elements >= 32 ? ~__mmask32{0} : (__mmask32{1} << elements) - 1;
}

/// r[k] becomes column k of the 16 x 16 matrix of 32-bit words whose row i is r[i]:
/// interleaves of words, then of word pairs, then a 4 x 4 transpose of 128-bit lanes.
__attribute__((target("avx512f"))) inline void Transpose16x16Words(__m512i (&r)[16]) {
  // The masked forms with every lane set: GCC 12's plain intrinsics pass
  // _mm512_undefined_epi32(), which -Wmaybe-uninitialized reports wherever they inline.
  constexpr __mmask16 kAll16 = 0xFFFF;
  constexpr __mmask8 kAll8 = 0xFF;
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_mask_unpacklo_epi32(r[i], kAll16, r[i], r[i + 1]);
    t[i + 1] = _mm512_mask_unpackhi_epi32(r[i], kAll16, r[i], r[i + 1]);
  }
  // u[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_mask_unpacklo_epi64(t[g], kAll8, t[g], t[g + 2]);
    u[g + 1] = _mm512_mask_unpackhi_epi64(t[g], kAll8, t[g], t[g + 2]);
    u[g + 2] = _mm512_mask_unpacklo_epi64(t[g + 1], kAll8, t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_mask_unpackhi_epi64(t[g + 1], kAll8, t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_mask_shuffle_i32x4(u[c], kAll16, u[c], u[4 + c], 0x44);
    const __m512i v1 = _mm512_mask_shuffle_i32x4(u[c], kAll16, u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_mask_shuffle_i32x4(u[8 + c], kAll16, u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_mask_shuffle_i32x4(u[8 + c], kAll16, u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_mask_shuffle_i32x4(v0, kAll16, v0, v2, 0x88);
    r[4 + c] = _mm512_mask_shuffle_i32x4(v0, kAll16, v0, v2, 0xDD);
    r[8 + c] = _mm512_mask_shuffle_i32x4(v1, kAll16, v1, v3, 0x88);
    r[12 + c] = _mm512_mask_shuffle_i32x4(v1, kAll16, v1, v3, 0xDD);
  }
}

// pack_bf16_dim_pairs for contiguous rows: blocks of 16 rows x 16 element pairs.
__attribute__((target("avx512f,avx512bw"))) inline void PackDimPairsAvx512(
    const RowView& rows, int64_t first, int64_t count, int64_t n, uint16_t* dst) {
  const int64_t dim = rows.cols(), pairs = (dim + 1) / 2;
  for (int64_t c0 = 0; c0 < count; c0 += 16) {
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      const __mmask32 lanes = FirstBf16Lanes(dim - 2 * p0);  // an odd dim's last pair: (x, 0)
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] =
            c0 + i < count
                ? _mm512_maskz_loadu_epi16(
                      lanes, static_cast<const uint16_t*>(rows.row_data(first + c0 + i)) + 2 * p0)
                : _mm512_setzero_si512();
      }
      Transpose16x16Words(r);
      const __mmask16 keys =
          static_cast<__mmask16>(count - c0 >= 16 ? 0xFFFF : (1u << (count - c0)) - 1);
      for (int64_t k = 0; k < std::min<int64_t>(16, pairs - p0); ++k) {
        _mm512_mask_storeu_epi32(dst + (p0 + k) * 2 * n + 2 * c0, keys, r[k]);
      }
    }
  }
}

// pack_bf16_row_pairs for contiguous rows: rows 2d and 2d + 1 interleaved 32 elements at a
// time.
__attribute__((target("avx512f,avx512bw"))) inline void PackRowPairsAvx512(
    const RowView& rows, int64_t first, int64_t count, int64_t ld, uint16_t* dst) {
  const int64_t dim = rows.cols();
  alignas(64) uint16_t order[2][32];  // output lane 2l <- x lane l, 2l + 1 <- y lane l
  for (int l = 0; l < 16; ++l) {
    for (int half = 0; half < 2; ++half) {
      order[half][2 * l] = static_cast<uint16_t>(16 * half + l);
      order[half][2 * l + 1] = static_cast<uint16_t>(32 + 16 * half + l);
    }
  }
  const __m512i low = _mm512_load_si512(order[0]), high = _mm512_load_si512(order[1]);
  for (int64_t c = 0; c < count; c += 2) {
    const uint16_t* x = static_cast<const uint16_t*>(rows.row_data(first + c));
    const uint16_t* y =
        c + 1 < count ? static_cast<const uint16_t*>(rows.row_data(first + c + 1)) : nullptr;
    uint16_t* pair = dst + c * ld;
    for (int64_t e = 0; e < dim; e += 32) {
      const __mmask32 lanes = FirstBf16Lanes(dim - e);
      const __m512i xv = _mm512_maskz_loadu_epi16(lanes, x + e);
      const __m512i yv = y ? _mm512_maskz_loadu_epi16(lanes, y + e) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi16(pair + 2 * e, FirstBf16Lanes(2 * (dim - e)),
                               _mm512_permutex2var_epi16(xv, low, yv));
      if (dim - e > 16) {
        _mm512_mask_storeu_epi16(pair + 2 * e + 32, FirstBf16Lanes(2 * (dim - e) - 32),
                                 _mm512_permutex2var_epi16(xv, high, yv));
      }
    }
  }
}

/// dst(c, e) = rows[first + c][e] for c < count, e < dim = rows.cols(); zero for
/// dim <= e < dst.ld. `rows` holds bfloat16.
inline void pack_bf16_rows(const RowView& rows, int64_t first, int64_t count,
                           Matrix<uint16_t> dst) {
  const int64_t dim = rows.cols();
  for (int64_t c = 0; c < count; ++c) {
    const uint16_t* src = static_cast<const uint16_t*>(rows.row_data(first + c));
    uint16_t* row = dst.data + c * dst.ld;
    if (rows.col_stride() == 1) {
      std::memcpy(row, src, static_cast<size_t>(dim) * sizeof(uint16_t));
    } else {
      for (int64_t e = 0; e < dim; ++e) row[e] = src[e * rows.col_stride()];
    }
    std::fill(row + dim, row + dst.ld, uint16_t{0});
  }
}

/// Pairs over the head dim, [round_up(dim, 2) / 2][n][2] (dim = rows.cols()): element e
/// of row first + c at dst[(e / 2) * 2 n + 2 c + e % 2] for c < n; zero where c >= count
/// or e >= dim. n a multiple of 16.
inline void pack_bf16_dim_pairs(const RowView& rows, int64_t first, int64_t count, int64_t n,
                                uint16_t* dst) {
  const int64_t dim = rows.cols(), dim2 = dim + dim % 2;
  std::fill(dst, dst + dim2 * n, uint16_t{0});
  if (rows.col_stride() == 1 && __builtin_cpu_supports("avx512bw")) {
    return PackDimPairsAvx512(rows, first, count, n, dst);
  }
  for (int64_t c = 0; c < count; ++c) {
    const uint16_t* src = static_cast<const uint16_t*>(rows.row_data(first + c));
    for (int64_t e = 0; e < dim; ++e) {
      dst[(e / 2) * 2 * n + 2 * c + e % 2] = src[e * rows.col_stride()];
    }
  }
}

/// Pairs over the rows, [round_up(count, 2) / 2][ld][2]: element e of row first + c at
/// dst[(c / 2) * 2 ld + 2 e + c % 2]; zero where e >= dim = rows.cols() and in the odd
/// count's last pair.
inline void pack_bf16_row_pairs(const RowView& rows, int64_t first, int64_t count, int64_t ld,
                                uint16_t* dst) {
  std::fill(dst, dst + (count + count % 2) * ld, uint16_t{0});
  if (rows.col_stride() == 1 && __builtin_cpu_supports("avx512bw")) {
    return PackRowPairsAvx512(rows, first, count, ld, dst);
  }
  const int64_t dim = rows.cols();
  for (int64_t c = 0; c < count; ++c) {
    const uint16_t* src = static_cast<const uint16_t*>(rows.row_data(first + c));
    uint16_t* pair = dst + (c / 2) * 2 * ld + c % 2;
    for (int64_t e = 0; e < dim; ++e) pair[2 * e] = src[e * rows.col_stride()];
  }
}

}  // namespace sdpa::cpu
