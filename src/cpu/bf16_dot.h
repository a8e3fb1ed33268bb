#pragma once
// bfloat16 tile GEMMs with AVX512_BF16's vdpbf16ps, which multiplies 32 bf16 pairs and
// accumulates them into 16 float32 lanes per instruction: twice the FLOPs of an fp32 FMA.
// Highway 1.0.3 only emulates this instruction, so these kernels use intrinsics behind a
// runtime check (bf16_dot_available) and the flash forward calls them only then.
//
// Layouts (bf16 as uint16_t bits):
//   A [m, 2 * depth_pairs]: pair d of row r (elements 2d, 2d + 1, adjacent) at
//     A + r * lda + d * a_pair_stride; a_pair_stride = 2 is row-major (q rows, P rows),
//     lda = 2 with a_pair_stride = 2 n' reads a transposed pair-packed [depth_pairs][n'][2]
//     matrix (P^T and dS^T in the backward).
//   B pair-packed [depth_pairs][n][2]: element (d, j) of the logical [2 * depth_pairs, n]
//     matrix at B[(d / 2) * 2 n + 2 j + d % 2].
//   C [m, n] float32, n a multiple of 16.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace sdpa::cpu {

/// Whether this CPU has AVX512_BF16 and SDPA_DISABLE_BF16_DOT is not set to 1 (tests
/// use it to run the float32 path on such CPUs).
bool bf16_dot_available();

/// Round-to-nearest-even float32 -> bfloat16 bits of n values (n a multiple of 32).
__attribute__((target("avx512f,avx512bf16"))) inline void ConvertRowToBf16(
    const float* src, uint16_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; j += 32) {
    const __m512bh pair =
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + j + 16), _mm512_loadu_ps(src + j));
    _mm512_storeu_si512(dst + j, (__m512i)pair);
  }
}

/// Two float32 rows as one row of bf16 pairs (round to nearest even): dst[2 j] = x[j],
/// dst[2 j + 1] = y[j] (0 when y is null) for j < n, n a multiple of 16. Rows 2d and
/// 2d + 1 of a matrix so paired form its pair-packed layout.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void ConvertRowPairToBf16(
    const float* x, const float* y, uint16_t* dst, int64_t n) {
  alignas(64) uint16_t order[32];  // lane 2l <- x lane l (index l), 2l + 1 <- y (16 + l)
  for (int l = 0; l < 16; ++l) {
    order[2 * l] = static_cast<uint16_t>(l);
    order[2 * l + 1] = static_cast<uint16_t>(16 + l);
  }
  const __m512i interleave = _mm512_load_si512(order);
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 yv = y ? _mm512_loadu_ps(y + j) : _mm512_setzero_ps();
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(yv, _mm512_loadu_ps(x + j));
    _mm512_storeu_si512(dst + 2 * j, _mm512_permutexvar_epi16(interleave, both));
  }
}

// The accumulate flag is a template argument: as a runtime one it made GCC spill and
// reload all accumulators around the depth loop.
template <int kRows, int kVecs, bool kAccumulate>
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16MicroTile(
    const uint16_t* a, int64_t lda, int64_t a_pair_stride, const uint16_t* b, int64_t n,
    float* c, int64_t ldc, int64_t depth_pairs) {
  __m512 acc[kRows][kVecs];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = kAccumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int64_t d = 0; d < depth_pairs; ++d) {
    __m512bh bv[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      bv[v] = (__m512bh)_mm512_loadu_si512(b + d * 2 * n + 32 * v);
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + d * a_pair_stride, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
  }
}

template <int kVecs>
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16Panel(
    int64_t m, const uint16_t* a, int64_t lda, int64_t a_pair_stride, const uint16_t* b,
    int64_t n, float* c, int64_t ldc, int64_t depth_pairs, bool accumulate) {
  int64_t r = 0;
  const auto tile = accumulate ? &Bf16MicroTile<6, kVecs, true> : &Bf16MicroTile<6, kVecs, false>;
  for (; r + 6 <= m; r += 6) {
    tile(a + r * lda, lda, a_pair_stride, b, n, c + r * ldc, ldc, depth_pairs);
  }
  a += r * lda;
  c += r * ldc;
#define SDPA_BF16_PANEL_TAIL(R)                                                               \
  return accumulate                                                                           \
             ? Bf16MicroTile<R, kVecs, true>(a, lda, a_pair_stride, b, n, c, ldc, depth_pairs) \
             : Bf16MicroTile<R, kVecs, false>(a, lda, a_pair_stride, b, n, c, ldc, depth_pairs)
  switch (m - r) {
    case 1: SDPA_BF16_PANEL_TAIL(1);
    case 2: SDPA_BF16_PANEL_TAIL(2);
    case 3: SDPA_BF16_PANEL_TAIL(3);
    case 4: SDPA_BF16_PANEL_TAIL(4);
    case 5: SDPA_BF16_PANEL_TAIL(5);
    default: return;
  }
#undef SDPA_BF16_PANEL_TAIL
}

/// C[m, n] (+)= A[m, 2 depth_pairs] . B (layouts above); 6 x 4-vector register tiles.
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16Gemm(
    int64_t m, int64_t n, int64_t depth_pairs, const uint16_t* a, int64_t lda,
    const uint16_t* b, float* c, int64_t ldc, bool accumulate, int64_t a_pair_stride = 2) {
  int64_t v = 0;
  const int64_t vecs = n / 16;
  for (; v + 4 <= vecs; v += 4) {
    Bf16Panel<4>(m, a, lda, a_pair_stride, b + 32 * v, n, c + 16 * v, ldc, depth_pairs,
                 accumulate);
  }
#define SDPA_BF16_GEMM_TAIL(V) \
  return Bf16Panel<V>(m, a, lda, a_pair_stride, b + 32 * v, n, c + 16 * v, ldc, depth_pairs, \
                      accumulate)
  switch (vecs - v) {
    case 1: SDPA_BF16_GEMM_TAIL(1);
    case 2: SDPA_BF16_GEMM_TAIL(2);
    case 3: SDPA_BF16_GEMM_TAIL(3);
    default: return;
  }
#undef SDPA_BF16_GEMM_TAIL
}

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
    for (int64_t r = 0; r < rows; ++r) {
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

template <int kRows, int kVecs>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void Bf16ValueTile(
    const uint16_t* p, int64_t ld_p, const uint16_t* values, int64_t value_stride, int64_t n,
    int64_t lanes, float* acc, int64_t ld_acc) {
  __m512 a[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kVecs; ++j) a[r][j] = _mm512_loadu_ps(acc + r * ld_acc + 16 * j);
  }
  // Lane l of the pair vector = (row c lane l, row c + 1 lane l): index l of x, 32 + l of y.
  alignas(64) uint16_t order[32];
  for (int l = 0; l < 16; ++l) {
    order[2 * l] = static_cast<uint16_t>(l);
    order[2 * l + 1] = static_cast<uint16_t>(32 + l);
  }
  const __m512i interleave = _mm512_load_si512(order);
  __mmask16 mask[kVecs];  // the value lanes that exist (head_dim_v need not be a multiple of 16)
  for (int j = 0; j < kVecs; ++j) {
    const int64_t valid = std::clamp<int64_t>(lanes - 16 * j, 0, 16);
    mask[j] = static_cast<__mmask16>((uint32_t{1} << valid) - 1);
  }
  for (int64_t c = 0; c < n; c += 2) {
    const uint16_t* row0 = values + c * value_stride;
    const uint16_t* row1 = row0 + value_stride;
    const bool second = c + 1 < n;  // an odd last key pairs with zeros (its weight is 0)
    __m512bh pairs[kVecs];
    for (int j = 0; j < kVecs; ++j) {
      const __m256i x = _mm256_maskz_loadu_epi16(mask[j], row0 + 16 * j);
      const __m256i y = _mm256_maskz_loadu_epi16(second ? mask[j] : __mmask16{0}, row1 + 16 * j);
      pairs[j] = (__m512bh)_mm512_permutex2var_epi16(_mm512_castsi256_si512(x), interleave,
                                                     _mm512_castsi256_si512(y));
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t weights;
      std::memcpy(&weights, p + r * ld_p + c, sizeof weights);
      const __m512bh w = (__m512bh)_mm512_set1_epi32(weights);
      for (int j = 0; j < kVecs; ++j) a[r][j] = _mm512_dpbf16_ps(a[r][j], w, pairs[j]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kVecs; ++j) _mm512_storeu_ps(acc + r * ld_acc + 16 * j, a[r][j]);
  }
}

/// P.v of few query rows over value rows read in place (decoding):
/// acc[r * ld_acc + e] += sum_c P[r][c] value_c[e] for r < rows, c < n, e < head_dim_v,
/// where P is bf16 bits (p + r * ld_p, n rounded up to even readable, the padding column
/// weighing 0) and value_c = values + c * value_stride (head_dim_v bf16 elements, unit
/// stride; nothing past them is read). acc rows are padded to a multiple of 16 floats.
/// Keys are taken in pairs: vdpbf16ps multiplies (P[r][c], P[r][c + 1]) by the two rows'
/// interleaved lanes.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) inline void Bf16AccumulateValues(
    const uint16_t* p, int64_t rows, int64_t ld_p, const uint16_t* values, int64_t value_stride,
    int64_t head_dim_v, int64_t n, float* acc, int64_t ld_acc) {
  for (int64_t e = 0; e < head_dim_v; e += 64) {
    const int64_t lanes = head_dim_v - e;
    const int64_t vecs = std::min<int64_t>(4, (lanes + 15) / 16);
    for (int64_t r = 0; r < rows; r += 4) {
      const int64_t m = std::min<int64_t>(4, rows - r);
      const uint16_t* pr = p + r * ld_p;
      float* ar = acc + r * ld_acc + e;
      const uint16_t* ve = values + e;
#define SDPA_BF16_VALUE_TILE(R, V) \
  return Bf16ValueTile<R, V>(pr, ld_p, ve, value_stride, n, lanes, ar, ld_acc)
      auto tile = [&](int64_t rr, int64_t vv) {
        switch (rr * 4 + vv) {
          case 5: SDPA_BF16_VALUE_TILE(1, 1);
          case 6: SDPA_BF16_VALUE_TILE(1, 2);
          case 7: SDPA_BF16_VALUE_TILE(1, 3);
          case 8: SDPA_BF16_VALUE_TILE(1, 4);
          case 9: SDPA_BF16_VALUE_TILE(2, 1);
          case 10: SDPA_BF16_VALUE_TILE(2, 2);
          case 11: SDPA_BF16_VALUE_TILE(2, 3);
          case 12: SDPA_BF16_VALUE_TILE(2, 4);
          case 13: SDPA_BF16_VALUE_TILE(3, 1);
          case 14: SDPA_BF16_VALUE_TILE(3, 2);
          case 15: SDPA_BF16_VALUE_TILE(3, 3);
          case 16: SDPA_BF16_VALUE_TILE(3, 4);
          case 17: SDPA_BF16_VALUE_TILE(4, 1);
          case 18: SDPA_BF16_VALUE_TILE(4, 2);
          case 19: SDPA_BF16_VALUE_TILE(4, 3);
          default: SDPA_BF16_VALUE_TILE(4, 4);
        }
      };
#undef SDPA_BF16_VALUE_TILE
      tile(m, vecs);
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace sdpa::cpu
