#pragma once
// bfloat16 tile GEMMs with AVX512_BF16's vdpbf16ps, which multiplies 32 bf16 pairs and
// accumulates them into 16 float32 lanes per instruction: twice the FLOPs of an fp32 FMA.
// Highway 1.0.3 only emulates this instruction, so these kernels use intrinsics behind a
// runtime check (bf16_dot_available) and the flash forward calls them only then.
//
// Layouts (bf16 as uint16_t bits):
//   A [m, 2 * depth_pairs] row-major (q rows, or P rows): a pair is two adjacent elements.
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
    const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + j + 16), _mm512_loadu_ps(src + j));
    _mm512_storeu_si512(dst + j, (__m512i)pair);
  }
}

template <int kRows, int kVecs>
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16MicroTile(
    const uint16_t* a, int64_t lda, const uint16_t* b, int64_t n, float* c, int64_t ldc,
    int64_t depth_pairs, bool accumulate) {
  __m512 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16 * v) : _mm512_setzero_ps();
    }
  }
  for (int64_t d = 0; d < depth_pairs; ++d) {
    __m512bh bv[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      bv[v] = (__m512bh)_mm512_loadu_si512(b + d * 2 * n + 32 * v);
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * d, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
  }
}

template <int kVecs>
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16Panel(
    int64_t m, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t n, float* c,
    int64_t ldc, int64_t depth_pairs, bool accumulate) {
  int64_t r = 0;
  for (; r + 6 <= m; r += 6) {
    Bf16MicroTile<6, kVecs>(a + r * lda, lda, b, n, c + r * ldc, ldc, depth_pairs, accumulate);
  }
  a += r * lda;
  c += r * ldc;
  switch (m - r) {
    case 1: return Bf16MicroTile<1, kVecs>(a, lda, b, n, c, ldc, depth_pairs, accumulate);
    case 2: return Bf16MicroTile<2, kVecs>(a, lda, b, n, c, ldc, depth_pairs, accumulate);
    case 3: return Bf16MicroTile<3, kVecs>(a, lda, b, n, c, ldc, depth_pairs, accumulate);
    case 4: return Bf16MicroTile<4, kVecs>(a, lda, b, n, c, ldc, depth_pairs, accumulate);
    case 5: return Bf16MicroTile<5, kVecs>(a, lda, b, n, c, ldc, depth_pairs, accumulate);
    default: return;
  }
}

/// C[m, n] (+)= A[m, 2 depth_pairs] . B (layouts above); 6 x 4-vector register tiles.
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16Gemm(
    int64_t m, int64_t n, int64_t depth_pairs, const uint16_t* a, int64_t lda,
    const uint16_t* b, float* c, int64_t ldc, bool accumulate) {
  int64_t v = 0;
  const int64_t vecs = n / 16;
  for (; v + 4 <= vecs; v += 4) {
    Bf16Panel<4>(m, a, lda, b + 32 * v, n, c + 16 * v, ldc, depth_pairs, accumulate);
  }
  switch (vecs - v) {
    case 1: return Bf16Panel<1>(m, a, lda, b + 32 * v, n, c + 16 * v, ldc, depth_pairs, accumulate);
    case 2: return Bf16Panel<2>(m, a, lda, b + 32 * v, n, c + 16 * v, ldc, depth_pairs, accumulate);
    case 3: return Bf16Panel<3>(m, a, lda, b + 32 * v, n, c + 16 * v, ldc, depth_pairs, accumulate);
    default: return;
  }
}

}  // namespace sdpa::cpu
