#pragma once
// vdpbf16ps kernels of the split-KV decode path (flash_decode_tile.cc): few query rows
// against bf16 key and value rows read in place, with no packing (each row is read once).
// Like bf16_dot.h, intrinsics behind the runtime check bf16_dot_available().

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/rows_ahead.h"

namespace sdpa::cpu {

// GCC 12's AVX-512 unpack and cast intrinsics use _mm512_undefined_*() internally, which
// -Wmaybe-uninitialized reports wherever they are inlined; nothing is uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// Lane k of the result = the sum of a[k]'s 16 lanes: a tree of in-block interleaves and
/// block shuffles (45 instructions for 16 sums instead of 16 horizontal reductions).
__attribute__((target("avx512f,avx512bf16"))) inline __m512 SumsOfLanes16(const __m512* a) {
  __m512 t[8];  // t[k], per 128-bit block: pair sums of a[2k] and a[2k + 1]
  for (int k = 0; k < 8; ++k) {
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]),
                         _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
  }
  __m512 u[4];  // u[m], block j: block j's sums of a[4m] .. a[4m + 3]
  for (int m = 0; m < 4; ++m) {
    const __m512d x = _mm512_castps_pd(t[2 * m]), y = _mm512_castps_pd(t[2 * m + 1]);
    u[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of query rows r0 .. r0 + 3 against 16 whole key rows (head_dim a multiple of 32),
// 4 keys at a time: each key vector loaded serves all 4 rows' accumulators, a quarter of
// the key loads of one row at a time (decode 10% faster hot).
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline)) inline void
Bf16ScoreFourRows(const uint16_t* q, int64_t ld_q, const char* base, const int64_t* offset,
                  int64_t head_dim, float scale, float* scores, int64_t ld_scores) {
  for (int kb = 0; kb < 16; kb += 4) {
    __m512 acc[16];  // acc[4 * r + k]: query row r0 + r, key kb + k
    for (__m512& a : acc) a = _mm512_setzero_ps();
    for (int64_t e = 0; e < head_dim; e += 32) {
      __m512bh qv[4];
      for (int r = 0; r < 4; ++r) qv[r] = (__m512bh)_mm512_loadu_si512(q + r * ld_q + e);
      for (int k = 0; k < 4; ++k) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(base + offset[kb + k] + 2 * e);
        for (int r = 0; r < 4; ++r) acc[4 * r + k] = _mm512_dpbf16_ps(acc[4 * r + k], qv[r], kv);
      }
    }
    const __m512 sums = _mm512_mul_ps(SumsOfLanes16(acc), _mm512_set1_ps(scale));
    // Lanes 4r .. 4r + 3 are row r's: a masked store puts them at its keys kb .. kb + 3.
    for (int r = 0; r < 4; ++r) {
      _mm512_mask_storeu_ps(scores + r * ld_scores + kb - 4 * r,
                            static_cast<__mmask16>(0xF << (4 * r)), sums);
    }
  }
}

/// Scores of few query rows against key rows read in place (decoding):
/// scores[r * ld_scores + c] = scale * q_r . key_c for r < rows and c in [0, n) (n a
/// multiple of 16), q_r = q + r * ld_q (bf16 bits, zero-padded to a multiple of 32) and
/// key_c = keys + c * key_stride (head_dim bf16 elements, unit stride); keys c >= valid
/// are not read (score 0), nor is anything past a key row's head_dim (masked loads).
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void Bf16ScoreKeys(
    const uint16_t* q, int64_t rows, int64_t ld_q, const uint16_t* keys, int64_t key_stride,
    int64_t head_dim, int64_t valid, int64_t n, float scale, float* scores, int64_t ld_scores) {
  for (int64_t c = 0; c < n; c += 16) {
    // Byte offsets of the group's key rows from `keys` (a row past `valid` repeats the
    // last valid one and is read with an all-zero mask).
    const int64_t in_group = std::clamp<int64_t>(valid - c, 0, 16);
    int64_t offset[16];
    for (int k = 0; k < 16; ++k) {
      offset[k] = std::min<int64_t>(c + k, std::max<int64_t>(valid - 1, 0)) * key_stride * 2;
    }
    const char* base = reinterpret_cast<const char*>(keys);
    const int64_t whole = in_group == 16 ? head_dim / 32 * 32 : 0;  // unmasked part
    int64_t r = 0;
    if (whole == head_dim) {
      for (; r + 4 <= rows; r += 4) {
        Bf16ScoreFourRows(q + r * ld_q, ld_q, base, offset, head_dim, scale,
                          scores + r * ld_scores + c, ld_scores);
      }
    }
    for (; r < rows; ++r) {
      __m512 acc[16];
      for (__m512& a : acc) a = _mm512_setzero_ps();
      const uint16_t* qr = q + r * ld_q;
      for (int64_t e = 0; e < whole; e += 32) {
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(qr + e);
        for (int k = 0; k < 16; ++k) {
          const __m512bh kv = (__m512bh)_mm512_loadu_si512(base + offset[k] + 2 * e);
          acc[k] = _mm512_dpbf16_ps(acc[k], qv, kv);
        }
      }
      for (int64_t e = whole; e < head_dim; e += 32) {
        const __mmask32 tail =
            head_dim - e >= 32 ? ~__mmask32{0} : (__mmask32{1} << (head_dim - e)) - 1;
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(qr + e);
        for (int k = 0; k < 16; ++k) {  // a constant trip count keeps acc in registers
          const __mmask32 load = k < in_group ? tail : __mmask32{0};
          const __m512bh kv = (__m512bh)_mm512_maskz_loadu_epi16(load, base + offset[k] + 2 * e);
          acc[k] = _mm512_dpbf16_ps(acc[k], qv, kv);
        }
      }
      _mm512_storeu_ps(scores + r * ld_scores + c,
                       _mm512_mul_ps(SumsOfLanes16(acc), _mm512_set1_ps(scale)));
    }
  }
}

/// Value elements per block of Bf16AccumulateValues' output order.
inline constexpr int64_t kValueBlock = 32;

// a[r][*] += (P[r][c], P[r][c + 1]) . (value rows c, c + 1) over kBlocks blocks of 32
// elements, the last one masked to `tail` when kTail; without kPair, row c + 1 reads as 0
// (an odd last key: its P padding column weighs 0). vpunpck{l,h}wd interleave the two
// rows within each 128-bit lane, so each 32-bit lane holds one element of both rows.
template <int kRows, int kBlocks, bool kTail, bool kPair>
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline)) inline void AccumulateKeyPair(
    __m512 (&a)[kRows][2 * kBlocks], const uint16_t* p, int64_t ld_p, const uint16_t* row0,
    int64_t value_stride, int64_t c, __mmask32 tail) {
  __m512bh pairs[2 * kBlocks];
#pragma GCC unroll 4
  for (int blk = 0; blk < kBlocks; ++blk) {
    const bool masked = kTail && blk == kBlocks - 1;
    const __mmask32 load = masked ? tail : ~__mmask32{0};
    const __m512i x = _mm512_maskz_loadu_epi16(load, row0 + 32 * blk);
    const __m512i y = kPair ? _mm512_maskz_loadu_epi16(load, row0 + value_stride + 32 * blk)
                            : _mm512_setzero_si512();
    pairs[2 * blk] = (__m512bh)_mm512_unpacklo_epi16(x, y);
    pairs[2 * blk + 1] = (__m512bh)_mm512_unpackhi_epi16(x, y);
  }
#pragma GCC unroll 2
  for (int r = 0; r < kRows; ++r) {
    int32_t weights;
    std::memcpy(&weights, p + r * ld_p + c, sizeof weights);
    const __m512bh w = (__m512bh)_mm512_set1_epi32(weights);
#pragma GCC unroll 8
    for (int j = 0; j < 2 * kBlocks; ++j) a[r][j] = _mm512_dpbf16_ps(a[r][j], w, pairs[j]);
  }
}

// acc rows r < kRows, kBlocks blocks of 32 elements (two vectors each), = alpha[r] acc +
// P . values for the n keys, with the accumulators held in registers over all of them.
template <int kRows, int kBlocks, bool kTail>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void Bf16ValueTile(
    const uint16_t* p, int64_t ld_p, const uint16_t* values, int64_t value_stride, int64_t n,
    __mmask32 tail, const float* alpha, float* acc, int64_t ld_acc, const RowsAhead& ahead,
    int64_t ahead_elements) {
  constexpr int kVecs = 2 * kBlocks;
  __m512 a[kRows][kVecs];
#pragma GCC unroll 2
  for (int r = 0; r < kRows; ++r) {
    const __m512 scale = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) {
      a[r][j] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * ld_acc + 16 * j), scale);
    }
  }
  int64_t c = 0;
  for (; c + 1 < n; c += 2) {
    PrefetchRows(ahead, value_stride, ahead_elements, c, c + 2);
    AccumulateKeyPair<kRows, kBlocks, kTail, true>(a, p, ld_p, values + c * value_stride,
                                                   value_stride, c, tail);
  }
  if (c < n) {
    PrefetchRows(ahead, value_stride, ahead_elements, c, c + 2);
    AccumulateKeyPair<kRows, kBlocks, kTail, false>(a, p, ld_p, values + c * value_stride,
                                                    value_stride, c, tail);
  }
#pragma GCC unroll 2
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) _mm512_storeu_ps(acc + r * ld_acc + 16 * j, a[r][j]);
  }
}

/// Most blocks one pass of Bf16AccumulateValues covers. Whole value rows (head_dim_v <= 128)
/// in one pass keep the reads in address order, which the hardware prefetchers follow;
/// half-row passes read every other pair of cache lines and decoded slower.
inline constexpr int kValueBlocksPerPass = 4;
/// Query rows per pass: two rows of kValueBlocksPerPass blocks are 16 accumulators.
inline constexpr int kValueRowsPerPass = 2;

/// P.v of few query rows over value rows read in place (decoding), with the online
/// softmax's rescale of the rows so far folded into the accumulator loads:
/// acc[r * ld_acc + e'] = alpha[r] acc[r * ld_acc + e'] + sum_c P[r][c] value_c[e] for
/// r < rows, c < n, e < head_dim_v,
/// where P is bf16 bits (p + r * ld_p, n rounded up to even readable, the padding column
/// weighing 0) and value_c = values + c * value_stride (head_dim_v bf16 elements, unit
/// stride; nothing past them is read). acc rows are padded to a multiple of kValueBlock
/// floats and come out in the order ValueOrderToElements describes and restores (once per
/// row at the end): vpunpck{l,h}wd interleave two rows within 128-bit lanes, cheaper than
/// the cross-lane permute that element order would need. The rows `ahead` are requested
/// into L2 along the way: memory streams them while this computes.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void Bf16AccumulateValues(
    const uint16_t* p, int64_t rows, int64_t ld_p, const uint16_t* values, int64_t value_stride,
    int64_t head_dim_v, int64_t n, const float* alpha, float* acc, int64_t ld_acc,
    const RowsAhead& ahead) {
  using Tile = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, __mmask32,
                        const float*, float*, int64_t, const RowsAhead&, int64_t);
  // [query rows - 1][blocks - 1][last block masked]
  static constexpr Tile kTiles[kValueRowsPerPass][kValueBlocksPerPass][2] = {
      {{Bf16ValueTile<1, 1, false>, Bf16ValueTile<1, 1, true>},
       {Bf16ValueTile<1, 2, false>, Bf16ValueTile<1, 2, true>},
       {Bf16ValueTile<1, 3, false>, Bf16ValueTile<1, 3, true>},
       {Bf16ValueTile<1, 4, false>, Bf16ValueTile<1, 4, true>}},
      {{Bf16ValueTile<2, 1, false>, Bf16ValueTile<2, 1, true>},
       {Bf16ValueTile<2, 2, false>, Bf16ValueTile<2, 2, true>},
       {Bf16ValueTile<2, 3, false>, Bf16ValueTile<2, 3, true>},
       {Bf16ValueTile<2, 4, false>, Bf16ValueTile<2, 4, true>}}};
  constexpr int64_t kPass = kValueBlocksPerPass * kValueBlock;
  for (int64_t e = 0; e < head_dim_v; e += kPass) {
    const int64_t lanes = std::min(head_dim_v - e, kPass);
    const int64_t blocks = (lanes + kValueBlock - 1) / kValueBlock;
    const int64_t last = lanes - (blocks - 1) * kValueBlock;  // elements in the last block
    const bool masked = last < kValueBlock;
    const __mmask32 tail = masked ? (__mmask32{1} << last) - 1 : ~__mmask32{0};
    for (int64_t r = 0; r < rows; r += kValueRowsPerPass) {
      const int64_t m = std::min<int64_t>(kValueRowsPerPass, rows - r);
      // The first pass requests the rows ahead, a pair per pair of keys it reads.
      const bool first = e == 0 && r == 0;
      kTiles[m - 1][blocks - 1][masked](p + r * ld_p, ld_p, values + e, value_stride, n, tail,
                                         alpha + r, acc + r * ld_acc + e, ld_acc,
                                         first ? ahead : RowsAhead{}, head_dim_v);
    }
  }
  // Rows ahead past those the key pairs requested (when ahead.n > n).
  PrefetchRows(ahead, value_stride, head_dim_v, (n + 1) / 2 * 2, ahead.n);
}

/// Puts an accumulator row of Bf16AccumulateValues ([0, n), n a multiple of kValueBlock)
/// into element order. Per block, vector 0 holds elements {0-3, 8-11, 16-19, 24-27} and
/// vector 1 {4-7, 12-15, 20-23, 28-31} (the 128-bit lanes of vpunpcklwd / vpunpckhwd);
/// element order takes their 128-bit quarters alternately.
__attribute__((target("avx512f"))) inline void ValueOrderToElements(float* row, int64_t n) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int64_t e = 0; e < n; e += kValueBlock) {
    const __m512 lo = _mm512_loadu_ps(row + e), hi = _mm512_loadu_ps(row + e + 16);
    _mm512_storeu_ps(row + e, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(row + e + 16, _mm512_permutex2var_ps(lo, second, hi));
  }
}

#pragma GCC diagnostic pop

}  // namespace sdpa::cpu
