#pragma once
// bfloat16 tile GEMMs with AVX512_BF16's vdpbf16ps, which multiplies 32 bf16 pairs and
// accumulates them into 16 float32 lanes per instruction: twice the FLOPs of an fp32 FMA.
// Highway 1.0.3 only emulates this instruction, so these kernels use intrinsics behind a
// runtime check (bf16_dot_available) and the flash forward calls them only then.
//
// Layouts (bf16 as uint16_t bits):
//   A [m, 2 * depth_pairs] (Bf16PairRows): pair d of row r (elements 2d, 2d + 1, adjacent)
//     at data + r * ld + d * pair_stride; pair_stride = 2 is row-major (q rows, P rows),
//     ld = 2 with pair_stride = 2 n' reads a transposed pair-packed [depth_pairs][n'][2]
//     matrix (P^T and dS^T in the backward).
//   B pair-packed [depth_pairs][n][2]: element (d, j) of the logical [2 * depth_pairs, n]
//     matrix at B[(d / 2) * 2 n + 2 j + d % 2].
//   C [m, n] float32, n a multiple of 16.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/matrix_view.h"

namespace sdpa::cpu {

/// Whether this CPU has AVX512_BF16 and SDPA_DISABLE_BF16_DOT is not set to 1 (tests
/// use it to run the float32 path on such CPUs).
bool bf16_dot_available();

/// Whether this CPU has AVX512_VBMI, which the decode kernels' float8 widening needs
/// (bf16_decode.h). Every CPU with AVX512_BF16 but Cooper Lake has it; there the decode
/// takes its float32 routes.
bool vbmi_available();

/// Round-to-nearest-even float32 -> bfloat16 bits of n values (n a multiple of 32).
__attribute__((target("avx512f,avx512bf16"))) inline void ConvertRowToBf16(const float* src,
                                                                           uint16_t* dst,
                                                                           int64_t n) {
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

/// A bf16 A operand [m, 2 depth_pairs] (layout above): pair d of row r at
/// data + r * ld + d * pair_stride.
struct Bf16PairRows {
  const uint16_t* data;
  int64_t ld;
  int64_t pair_stride = 2;

  /// Rows from r on.
  Bf16PairRows from(int64_t r) const { return {data + r * ld, ld, pair_stride}; }
};

// The accumulate flag is a template argument: as a runtime one it made GCC spill and
// reload all accumulators around the depth loop. The products start from zero and C is
// added at the end, so C's loads do not delay the first dpbf16 of every chain (the bf16
// forward at E = 128 ran 1.5-3.5% faster than with C loaded into the accumulators).
// b: pair-packed B as rows of pairs, b.ld = 2 n.
//
// These kernels are called, not inlined, so the 24-byte views (GemmDims, Bf16PairRows) go
// by reference: by value GCC copied them through the stack with a load wider than the
// store that wrote them, a store-forwarding stall per micro-tile that cost the bf16
// backward 4%.
template <int kRows, int kVecs, bool kAccumulate>
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16MicroTile(
    const Bf16PairRows& a, Matrix<const uint16_t> b, Matrix<float> c, int64_t depth_pairs) {
  const uint16_t* a_data = a.data;
  const uint16_t* b_data = b.data;
  float* c_data = c.data;
  const int64_t lda = a.ld, a_pair_stride = a.pair_stride, ldb = b.ld, ldc = c.ld;
  __m512 acc[kRows][kVecs];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < depth_pairs; ++d) {
    __m512bh bv[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      bv[v] = (__m512bh)_mm512_loadu_si512(b_data + d * ldb + 32 * v);
    }
    for (int r = 0; r < kRows; ++r) {
      int32_t pair;
      std::memcpy(&pair, a_data + r * lda + d * a_pair_stride, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) {
      float* out = c_data + r * ldc + 16 * v;
      _mm512_storeu_ps(out,
                       kAccumulate ? _mm512_add_ps(_mm512_loadu_ps(out), acc[r][v]) : acc[r][v]);
    }
  }
}

// All row blocks of one column panel: dims.n is kVecs vectors, b as in Bf16MicroTile.
template <int kVecs>
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16Panel(
    const GemmDims& dims, const Bf16PairRows& a, Matrix<const uint16_t> b, Matrix<float> c,
    GemmOutput output) {
  const int64_t m = dims.m, depth_pairs = dims.depth;
  const bool accumulate = output == GemmOutput::kAccumulate;
  int64_t r = 0;
  const auto tile = accumulate ? &Bf16MicroTile<6, kVecs, true> : &Bf16MicroTile<6, kVecs, false>;
  for (; r + 6 <= m; r += 6) tile(a.from(r), b, c.from(r, 0), depth_pairs);
  const Bf16PairRows a_tail = a.from(r);
  c = c.from(r, 0);
#define SDPA_BF16_PANEL_TAIL(R)                                             \
  return accumulate ? Bf16MicroTile<R, kVecs, true>(a_tail, b, c, depth_pairs) \
                    : Bf16MicroTile<R, kVecs, false>(a_tail, b, c, depth_pairs)
  switch (m - r) {
    case 1:
      SDPA_BF16_PANEL_TAIL(1);
    case 2:
      SDPA_BF16_PANEL_TAIL(2);
    case 3:
      SDPA_BF16_PANEL_TAIL(3);
    case 4:
      SDPA_BF16_PANEL_TAIL(4);
    case 5:
      SDPA_BF16_PANEL_TAIL(5);
    default:
      return;
  }
#undef SDPA_BF16_PANEL_TAIL
}

/// C[m, n] (+)= A[m, 2 depth_pairs] . B (layouts above; dims.depth counts pairs); 6 x
/// 4-vector register tiles.
__attribute__((target("avx512f,avx512bf16"))) inline void Bf16Gemm(
    const GemmDims& dims, const Bf16PairRows& a, const uint16_t* b, Matrix<float> c,
    GemmOutput output) {
  const Matrix<const uint16_t> b_pairs{b, 2 * dims.n};
  int64_t v = 0;
  const int64_t vecs = dims.n / 16;
  for (; v + 4 <= vecs; v += 4) {
    Bf16Panel<4>({dims.m, 64, dims.depth}, a, b_pairs.from(0, 32 * v), c.from(0, 16 * v),
                 output);
  }
  const GemmDims tail{dims.m, dims.n - 16 * v, dims.depth};
#define SDPA_BF16_GEMM_TAIL(V) \
  return Bf16Panel<V>(tail, a, b_pairs.from(0, 32 * v), c.from(0, 16 * v), output)
  switch (vecs - v) {
    case 1:
      SDPA_BF16_GEMM_TAIL(1);
    case 2:
      SDPA_BF16_GEMM_TAIL(2);
    case 3:
      SDPA_BF16_GEMM_TAIL(3);
    default:
      return;
  }
#undef SDPA_BF16_GEMM_TAIL
}

}  // namespace sdpa::cpu
