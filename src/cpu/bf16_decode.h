#pragma once
// vdpbf16ps kernels of the split-KV decode path (flash_decode_tile.cc): few query rows
// against bf16 key and value rows read in place, with no packing (each row is read once);
// float8_e4m3fn rows (a quantized KV cache) are widened to bf16 as they are loaded
// (e4m3_bf16.h). Like bf16_dot.h, intrinsics behind runtime checks: bf16_dot_available()
// and, for the byte permutes of that widening, vbmi_available() (every kernel here is
// compiled for AVX512_VBMI, as the widening inlines into them).

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/e4m3_bf16.h"

namespace sdpa::cpu {

/// Rows of bf16 bits read by the kernels below (query rows, P rows): row r at
/// data + r * stride, r < rows.
struct Bf16Rows {
  const uint16_t* data;
  int64_t stride;
  int64_t rows;

  const uint16_t* row(int64_t r) const { return data + r * stride; }
};

/// Key or value rows of a kv head read in place, T = uint16_t for bf16 bits or uint8_t for
/// float8_e4m3fn codes: row c at data + c * stride, of head_dim elements of unit stride
/// (nothing past them is read); rows c >= count are not read.
template <class T>
struct KvRowsOf {
  const T* data;
  int64_t stride;
  int64_t head_dim;
  int64_t count;
};
using Bf16KvRows = KvRowsOf<uint16_t>;

/// Value rows of a kv head read in place through their addresses, T as in KvRowsOf: row c
/// at rows[c] + first (a paged cache's rows lie one stride apart only within a page; a
/// pass over elements [first, ...) offsets them all), head_dim elements of unit stride
/// from rows[c]; rows c >= count are not read.
template <class T>
struct ValueRowsOf {
  const T* const* rows;
  int64_t first;
  int64_t head_dim;
  int64_t count;

  const T* row(int64_t c) const { return rows[c] + first; }
};

/// Requests rows [begin, min(end, rows.count)) of `rows` (whole rows of head_dim elements)
/// into L2 (prefetcht1, as the decode tile loop requests its rows).
template <class T>
inline void RequestValueRows(const ValueRowsOf<T>& rows, int64_t begin, int64_t end) {
  for (int64_t c = begin; c < std::min(end, rows.count); ++c) {
    const char* row = reinterpret_cast<const char*>(rows.rows[c]);
    for (int64_t offset = 0; offset < rows.head_dim * static_cast<int64_t>(sizeof(T));
         offset += 64) {
      __builtin_prefetch(row + offset, 0, 2);
    }
  }
}

/// 32 elements at p of a row of T as bf16 bits (those outside `mask` read as 0).
template <class T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"), always_inline)) inline __m512i
LoadBf16Words(const E4M3Bf16Table& table, const T* p, __mmask32 mask) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return E4M3ToBf16(table, p, mask);
  } else {
    return _mm512_maskz_loadu_epi16(mask, p);
  }
}

/// Float32 rows written by the kernels below (scores): row r at data + r * stride.
struct Float32Rows {
  float* data;
  int64_t stride;

  float* row(int64_t r) const { return data + r * stride; }
};

/// The output accumulators of the online softmax (online_softmax.h) that a P.v pass adds
/// to: row r at o + r * stride, multiplied first by alpha[r] (the rescale of the rows
/// so far).
struct RescaledAccumulators {
  const float* alpha;
  float* o;
  int64_t stride;
};

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

// 16 key rows at byte offsets offset[k] from base, head_dim bf16 elements each.
struct Bf16KeyGroup {
  const char* base;
  const int64_t* offset;
  int64_t head_dim;
};

// Scores of query rows q.row(0 .. 3) against the 16 whole key rows of `keys` (elements of
// T, head_dim a multiple of 32) into scores.row(0 .. 3)[0, 16), times scale, 4 keys at a
// time: each key vector loaded serves all 4 rows' accumulators, a quarter of the key loads
// of one row at a time (decode 10% faster hot).
template <class T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi"),
               always_inline)) inline void
Bf16ScoreFourRows(const Bf16Rows& q, const Bf16KeyGroup& keys, float scale,
                  const Float32Rows& scores, const E4M3Bf16Table& table) {
  const uint16_t* q_data = q.data;
  float* scores_data = scores.data;
  const char* base = keys.base;
  const int64_t* offset = keys.offset;
  const int64_t ld_q = q.stride, head_dim = keys.head_dim, ld_scores = scores.stride;
  for (int kb = 0; kb < 16; kb += 4) {
    __m512 acc[16];  // acc[4 * r + k]: query row r, key kb + k
    for (__m512& a : acc) a = _mm512_setzero_ps();
    for (int64_t e = 0; e < head_dim; e += 32) {
      __m512bh qv[4];
      for (int r = 0; r < 4; ++r) qv[r] = (__m512bh)_mm512_loadu_si512(q_data + r * ld_q + e);
      for (int k = 0; k < 4; ++k) {
        const T* key = reinterpret_cast<const T*>(base + offset[kb + k]) + e;
        const __m512bh kv = (__m512bh)LoadBf16Words(table, key, ~__mmask32{0});
        for (int r = 0; r < 4; ++r) acc[4 * r + k] = _mm512_dpbf16_ps(acc[4 * r + k], qv[r], kv);
      }
    }
    const __m512 sums = _mm512_mul_ps(SumsOfLanes16(acc), _mm512_set1_ps(scale));
    // Lanes 4r .. 4r + 3 are row r's: a masked store puts them at its keys kb .. kb + 3.
    for (int r = 0; r < 4; ++r) {
      _mm512_mask_storeu_ps(scores_data + r * ld_scores + kb - 4 * r,
                            static_cast<__mmask16>(0xF << (4 * r)), sums);
    }
  }
}

/// Scores of few query rows against key rows read in place (decoding):
/// scores.row(r)[c] = scale * q_r . key_c for r < q.rows and c in [0, n) (n a multiple of
/// 16), q_r = q.row(r) (bf16 bits, zero-padded to a multiple of 32) and key_c row c of
/// `keys` (bf16 bits or float8_e4m3fn codes); keys c >= keys.count are not read (score 0),
/// nor is anything past a key row's head_dim (masked loads).
template <class T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi"))) inline void
Bf16ScoreKeys(const Bf16Rows& q, const KvRowsOf<T>& keys, int64_t n, float scale,
              const Float32Rows& scores) {
  // Unused (and dropped by the compiler) for bf16 rows.
  const E4M3Bf16Table table = LoadE4M3Bf16Table();
  const uint16_t* q_data = q.data;
  float* scores_data = scores.data;
  const int64_t rows = q.rows, ld_q = q.stride, ld_scores = scores.stride;
  const int64_t key_stride = keys.stride, head_dim = keys.head_dim, valid = keys.count;
  for (int64_t c = 0; c < n; c += 16) {
    // Byte offsets of the group's key rows from keys.data (a row past `valid` repeats the
    // last valid one and is read with an all-zero mask).
    const int64_t in_group = std::clamp<int64_t>(valid - c, 0, 16);
    int64_t offset[16];
    for (int k = 0; k < 16; ++k) {
      offset[k] = std::min<int64_t>(c + k, std::max<int64_t>(valid - 1, 0)) * key_stride *
                  static_cast<int64_t>(sizeof(T));
    }
    const char* base = reinterpret_cast<const char*>(keys.data);
    const int64_t whole = in_group == 16 ? head_dim / 32 * 32 : 0;  // unmasked part
    int64_t r = 0;
    if (whole == head_dim) {
      for (; r + 4 <= rows; r += 4) {
        Bf16ScoreFourRows<T>({q_data + r * ld_q, ld_q, 4}, {base, offset, head_dim}, scale,
                             {scores_data + r * ld_scores + c, ld_scores}, table);
      }
    }
    for (; r < rows; ++r) {
      __m512 acc[16];
      for (__m512& a : acc) a = _mm512_setzero_ps();
      const uint16_t* qr = q_data + r * ld_q;
      for (int64_t e = 0; e < whole; e += 32) {
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(qr + e);
        for (int k = 0; k < 16; ++k) {
          const T* key = reinterpret_cast<const T*>(base + offset[k]) + e;
          const __m512bh kv = (__m512bh)LoadBf16Words(table, key, ~__mmask32{0});
          acc[k] = _mm512_dpbf16_ps(acc[k], qv, kv);
        }
      }
      for (int64_t e = whole; e < head_dim; e += 32) {
        const __mmask32 tail =
            head_dim - e >= 32 ? ~__mmask32{0} : (__mmask32{1} << (head_dim - e)) - 1;
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(qr + e);
        for (int k = 0; k < 16; ++k) {  // a constant trip count keeps acc in registers
          const __mmask32 load = k < in_group ? tail : __mmask32{0};
          const T* key = reinterpret_cast<const T*>(base + offset[k]) + e;
          const __m512bh kv = (__m512bh)LoadBf16Words(table, key, load);
          acc[k] = _mm512_dpbf16_ps(acc[k], qv, kv);
        }
      }
      _mm512_storeu_ps(scores_data + r * ld_scores + c,
                       _mm512_mul_ps(SumsOfLanes16(acc), _mm512_set1_ps(scale)));
    }
  }
}

/// Value elements per block of Bf16AccumulateValues' output order.
inline constexpr int64_t kValueBlock = 32;

// a[r][*] += (p.row(r)[c], p.row(r)[c + 1]) . (value rows c, c + 1) over kBlocks blocks of
// 32 elements, the last one masked to `tail` when kTail; without kPair, row c + 1 reads as 0
// (an odd last key: its P padding column weighs 0). vpunpck{l,h}wd interleave the two
// rows within each 128-bit lane, so each 32-bit lane holds one element of both rows.
template <class T, int kRows, int kBlocks, bool kTail, bool kPair>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi"),
               always_inline)) inline void
AccumulateKeyPair(__m512 (&a)[kRows][2 * kBlocks], const Bf16Rows& p, const ValueRowsOf<T>& values,
                  int64_t c, __mmask32 tail, const E4M3Bf16Table& table) {
  const T* row0 = values.row(c);
  const T* row1 = kPair ? values.row(c + 1) : row0;
  __m512bh pairs[2 * kBlocks];
#pragma GCC unroll 4
  for (int blk = 0; blk < kBlocks; ++blk) {
    const bool masked = kTail && blk == kBlocks - 1;
    const __mmask32 load = masked ? tail : ~__mmask32{0};
    const __m512i x = LoadBf16Words(table, row0 + 32 * blk, load);
    const __m512i y = kPair ? LoadBf16Words(table, row1 + 32 * blk, load) : _mm512_setzero_si512();
    pairs[2 * blk] = (__m512bh)_mm512_unpacklo_epi16(x, y);
    pairs[2 * blk + 1] = (__m512bh)_mm512_unpackhi_epi16(x, y);
  }
#pragma GCC unroll 2
  for (int r = 0; r < kRows; ++r) {
    int32_t weights;
    std::memcpy(&weights, p.row(r) + c, sizeof weights);
    const __m512bh w = (__m512bh)_mm512_set1_epi32(weights);
#pragma GCC unroll 8
    for (int j = 0; j < 2 * kBlocks; ++j) a[r][j] = _mm512_dpbf16_ps(a[r][j], w, pairs[j]);
  }
}

// acc rows r < kRows, kBlocks blocks of 32 elements (two vectors each), = acc.alpha[r] acc
// + P . values for the values.count keys, with the accumulators held in registers over all
// of them. `values` start at the pass's first element; their head_dim is the whole rows',
// which the requests for the rows `ahead` read.
template <class T, int kRows, int kBlocks, bool kTail>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi"))) void Bf16ValueTile(
    const Bf16Rows& p, const ValueRowsOf<T>& values, __mmask32 tail,
    const RescaledAccumulators& acc, const ValueRowsOf<T>& ahead) {
  // Unused (and dropped by the compiler) for bf16 rows.
  const E4M3Bf16Table table = LoadE4M3Bf16Table();
  constexpr int kVecs = 2 * kBlocks;
  // Copies and scalars of the operands, so that the key loop below reads them from
  // registers, not through the references.
  const Bf16Rows p_rows = p;
  const ValueRowsOf<T> value_rows = values;
  const ValueRowsOf<T> rows_ahead = ahead;
  const int64_t n = values.count;
  const int64_t ld_acc = acc.stride;
  __m512 a[kRows][kVecs];
#pragma GCC unroll 2
  for (int r = 0; r < kRows; ++r) {
    const __m512 scale = _mm512_set1_ps(acc.alpha[r]);
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) {
      a[r][j] = _mm512_mul_ps(_mm512_loadu_ps(acc.o + r * ld_acc + 16 * j), scale);
    }
  }
  int64_t c = 0;
  for (; c + 1 < n; c += 2) {
    RequestValueRows(rows_ahead, c, c + 2);
    AccumulateKeyPair<T, kRows, kBlocks, kTail, true>(a, p_rows, value_rows, c, tail, table);
  }
  if (c < n) {
    RequestValueRows(rows_ahead, c, c + 2);
    AccumulateKeyPair<T, kRows, kBlocks, kTail, false>(a, p_rows, value_rows, c, tail, table);
  }
#pragma GCC unroll 2
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int j = 0; j < kVecs; ++j) _mm512_storeu_ps(acc.o + r * ld_acc + 16 * j, a[r][j]);
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
/// acc.o[r * acc.stride + e'] = acc.alpha[r] acc.o[r * acc.stride + e'] +
/// sum_c P[r][c] value_c[e] for r < p.rows, c < values.count, e < values.head_dim,
/// where P is bf16 bits (p.row(r), count rounded up to even readable, the padding column
/// weighing 0) and value_c row c of `values`. acc rows are padded to a multiple of
/// kValueBlock floats and come out in the order ValueOrderToElements describes and
/// restores (once per row at the end): vpunpck{l,h}wd interleave two rows within 128-bit
/// lanes, cheaper than the cross-lane permute that element order would need. The rows
/// `ahead` are requested into L2 along the way: memory streams them while this computes.
/// Value rows of T as in ValueRowsOf (values.first = 0), any distance apart: one pass covers
/// a tile whose rows span several pages.
template <class T>
__attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi"))) inline void Bf16AccumulateValues(
    const Bf16Rows& p, const ValueRowsOf<T>& values, const RescaledAccumulators& acc,
    const ValueRowsOf<T>& ahead) {
  using Tile = void (*)(const Bf16Rows&, const ValueRowsOf<T>&, __mmask32,
                        const RescaledAccumulators&, const ValueRowsOf<T>&);
  // [query rows - 1][blocks - 1][last block masked]
  static constexpr Tile kTiles[kValueRowsPerPass][kValueBlocksPerPass][2] = {
      {{Bf16ValueTile<T, 1, 1, false>, Bf16ValueTile<T, 1, 1, true>},
       {Bf16ValueTile<T, 1, 2, false>, Bf16ValueTile<T, 1, 2, true>},
       {Bf16ValueTile<T, 1, 3, false>, Bf16ValueTile<T, 1, 3, true>},
       {Bf16ValueTile<T, 1, 4, false>, Bf16ValueTile<T, 1, 4, true>}},
      {{Bf16ValueTile<T, 2, 1, false>, Bf16ValueTile<T, 2, 1, true>},
       {Bf16ValueTile<T, 2, 2, false>, Bf16ValueTile<T, 2, 2, true>},
       {Bf16ValueTile<T, 2, 3, false>, Bf16ValueTile<T, 2, 3, true>},
       {Bf16ValueTile<T, 2, 4, false>, Bf16ValueTile<T, 2, 4, true>}}};
  constexpr int64_t kPass = kValueBlocksPerPass * kValueBlock;
  const int64_t rows = p.rows, head_dim_v = values.head_dim, n = values.count;
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
      kTiles[m - 1][blocks - 1][masked](
          {p.row(r), p.stride, m}, {values.rows, e, head_dim_v, n}, tail,
          {acc.alpha + r, acc.o + r * acc.stride + e, acc.stride},
          first ? ahead : ValueRowsOf<T>{ahead.rows, 0, ahead.head_dim, 0});
    }
  }
  // Rows ahead past those the key pairs requested (when ahead.count > n).
  RequestValueRows(ahead, (n + 1) / 2 * 2, ahead.count);
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
