// Register-blocked float32 GEMM for attention tiles: C[M, N] (+)= A[M, K] . B[K, N], B and
// C row-major, N a multiple of the vector width; A is read through two strides, so a
// transposed A (P^T, dS^T in the backward) needs no copy. Accumulating, C's rows may be
// scaled first (C = c_scale[r] C + A.B): the online softmax's rescale of the output
// accumulator then costs no pass of its own. Serves q.k^T (B = packed k^T),
// P.v (B = packed v) and the backward's products. Per-target code: include after
// foreach_target.h.

#if defined(SDPA_CPU_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_GEMM_INL_H_
#undef SDPA_CPU_GEMM_INL_H_
#else
#define SDPA_CPU_GEMM_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "core/kernel_inline.h"
#include "cpu/matrix_view.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Micro-tile shape per target: accumulators + one B row + one broadcast A value must fit
// the register file (32 zmm on AVX-512: 6 x 4 = 24 accumulators; 16 ymm on AVX2: 6 x 2).
// kGemmRows must stay <= 6: GemmPanel's remainder switch covers up to 5 leftover rows.
#if HWY_TARGET <= HWY_AVX3
inline constexpr int64_t kGemmRows = 6;
inline constexpr int64_t kGemmVecs = 4;
#elif HWY_TARGET == HWY_AVX2
inline constexpr int64_t kGemmRows = 6;
inline constexpr int64_t kGemmVecs = 2;
#else
inline constexpr int64_t kGemmRows = 4;
inline constexpr int64_t kGemmVecs = 2;
#endif
static_assert(kGemmRows <= 6);

template <int64_t kRows, int64_t kVecs>
SDPA_INLINE void GemmMicroTile(StridedMatrix<const float> a, Matrix<const float> b, Matrix<float> c,
                               int64_t depth, GemmOutput output, const float* c_scale) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float* HWY_RESTRICT a_data = a.data;
  const float* HWY_RESTRICT b_data = b.data;
  float* HWY_RESTRICT c_data = c.data;
  const int64_t lda = a.ld, a_step = a.step, ldb = b.ld, ldc = c.ld;
  const bool accumulate = output == GemmOutput::kAccumulate;
  // The products are summed from zero and C is added once at the end: C then takes one
  // rounding per call instead of one per product. The flash forward's output accumulator
  // is C of one call per key tile, so at S = 65536 a row rounds 1024 times, not 65536
  // (float32 error 9.3e-6 -> see docs/design.md).
  V acc[kRows][kVecs];
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t v = 0; v < kVecs; ++v) acc[r][v] = hn::Zero(d);
  }
  for (int64_t k = 0; k < depth; ++k) {
    V bv[kVecs];
    for (int64_t v = 0; v < kVecs; ++v) bv[v] = hn::LoadU(d, b_data + k * ldb + v * lanes);
    for (int64_t r = 0; r < kRows; ++r) {
      const V av = hn::Set(d, a_data[r * lda + k * a_step]);
      for (int64_t v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t v = 0; v < kVecs; ++v) {
      float* out = c_data + r * ldc + v * lanes;
      V sum = acc[r][v];
      // One rounding either way: c_scale[r] C + acc is fused (and C + acc with a scale of 1).
      if (accumulate && c_scale) sum = hn::MulAdd(hn::LoadU(d, out), hn::Set(d, c_scale[r]), sum);
      if (accumulate && !c_scale) sum = hn::Add(hn::LoadU(d, out), sum);
      hn::StoreU(sum, d, out);
    }
  }
}

// All row blocks of one column panel: dims.n is kVecs vectors.
template <int64_t kVecs>
SDPA_INLINE void GemmPanel(GemmDims dims, StridedMatrix<const float> a, Matrix<const float> b,
                           Matrix<float> c, GemmOutput output, const float* c_scale) {
  const int64_t m = dims.m, depth = dims.depth;
  int64_t r = 0;
  for (; r + kGemmRows <= m; r += kGemmRows) {
    GemmMicroTile<kGemmRows, kVecs>(a.from(r, 0), b, c.from(r, 0), depth, output,
                                    c_scale ? c_scale + r : nullptr);
  }
  // The remaining rows in one shorter micro-tile (one row at a time would make the loop
  // load-bound: one broadcast per kVecs FMAs).
  a = a.from(r, 0);
  c = c.from(r, 0);
  if (c_scale) c_scale += r;
#define SDPA_GEMM_ROWS_TAIL(R) return GemmMicroTile<R, kVecs>(a, b, c, depth, output, c_scale)
  switch (m - r) {
    case 1: SDPA_GEMM_ROWS_TAIL(1);
    case 2: SDPA_GEMM_ROWS_TAIL(2);
    case 3: SDPA_GEMM_ROWS_TAIL(3);
    case 4: SDPA_GEMM_ROWS_TAIL(4);
    case 5: SDPA_GEMM_ROWS_TAIL(5);
    default: return;
  }
#undef SDPA_GEMM_ROWS_TAIL
}

/// C[m, n] = A[m, depth] . B[depth, n] (+ C when accumulating, times c_scale[r] on row r
/// when c_scale is given); n % Lanes == 0. A is read through its two strides, so a
/// transposed A needs no copy.
SDPA_INLINE void Gemm(GemmDims dims, StridedMatrix<const float> a, Matrix<const float> b,
                      Matrix<float> c, GemmOutput output, const float* c_scale = nullptr) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t vecs = dims.n / lanes;
  int64_t v = 0;
  for (; v + kGemmVecs <= vecs; v += kGemmVecs) {
    GemmPanel<kGemmVecs>({dims.m, kGemmVecs * lanes, dims.depth}, a, b.from(0, v * lanes),
                         c.from(0, v * lanes), output, c_scale);
  }
  // The remaining vectors in one narrower panel (one vector per panel would make the loop
  // broadcast-bound: kGemmRows broadcasts per kGemmRows FMAs).
  const GemmDims tail{dims.m, dims.n - v * lanes, dims.depth};
  b = b.from(0, v * lanes);
  c = c.from(0, v * lanes);
#define SDPA_GEMM_VECS_TAIL(V) return GemmPanel<V>(tail, a, b, c, output, c_scale)
  switch (vecs - v) {
    case 1: SDPA_GEMM_VECS_TAIL(1);
    case 2: SDPA_GEMM_VECS_TAIL(2);
    case 3: SDPA_GEMM_VECS_TAIL(3);
    default: return;
  }
#undef SDPA_GEMM_VECS_TAIL
}

/// Per-row support of a tile's scores: row r of the tile can be nonzero only in columns
/// [begin[r], end[r]) (a band, document or padding edge crossing the tile).
struct RowSupport {
  const int64_t* begin;
  const int64_t* end;
};

/// Union [lo, hi) of the supports of rows [r, r + rows); lo >= hi when all are empty.
SDPA_INLINE void PanelSupport(const RowSupport& support, int64_t r, int64_t rows, int64_t& lo,
                              int64_t& hi) {
  lo = INT64_MAX;
  hi = 0;
  for (int64_t i = r; i < r + rows; ++i) {
    if (support.begin[i] >= support.end[i]) continue;
    lo = std::min(lo, support.begin[i]);
    hi = std::max(hi, support.end[i]);
  }
}

/// S[m, n] = A[m, depth] . B[depth, n], computing for each panel of kGemmRows rows only
/// the vectors covering its rows' support; the other entries are left as they were (the
/// caller masks them). A triangle or band edge crossing the tile costs about half a tile
/// instead of a whole one.
SDPA_INLINE void GemmRowSupport(GemmDims dims, StridedMatrix<const float> a, Matrix<const float> b,
                                Matrix<float> c, const RowSupport& support) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < dims.m; r += kGemmRows) {
    const int64_t rows = std::min(kGemmRows, dims.m - r);
    int64_t lo, hi;
    PanelSupport(support, r, rows, lo, hi);
    if (lo >= hi) continue;
    lo = lo / lanes * lanes;
    hi = std::min(dims.n, (hi + lanes - 1) / lanes * lanes);
    Gemm({rows, hi - lo, dims.depth}, a.from(r, 0), b.from(0, lo), c.from(r, lo),
         GemmOutput::kOverwrite);
  }
}

/// C[m, n] = c_scale[r] C + P[m, depth] . B[depth, n] (c_scale optional, as Gemm's) where
/// row r of P is zero outside its support: each panel of kGemmRows rows runs over the
/// union of its rows' support (within depth) only.
SDPA_INLINE void GemmAccumulateRowSupport(GemmDims dims, StridedMatrix<const float> p,
                                          Matrix<const float> b, Matrix<float> c,
                                          const RowSupport& support,
                                          const float* c_scale = nullptr) {
  const hn::ScalableTag<float> d;
  for (int64_t r = 0; r < dims.m; r += kGemmRows) {
    const int64_t rows = std::min(kGemmRows, dims.m - r);
    int64_t lo, hi;
    PanelSupport(support, r, rows, lo, hi);
    hi = std::min(hi, dims.depth);
    if (lo < hi) {
      Gemm({rows, dims.n, hi - lo}, p.from(r, lo), b.from(lo, 0), c.from(r, 0),
           GemmOutput::kAccumulate, c_scale ? c_scale + r : nullptr);
      continue;
    }
    // No product: the panel's rows only take their scale.
    for (int64_t i = r; i < r + rows && c_scale; ++i) {
      const auto scale = hn::Set(d, c_scale[i]);
      float* row = c.data + i * c.ld;
      for (int64_t j = 0; j < dims.n; j += static_cast<int64_t>(hn::Lanes(d))) {
        hn::StoreU(hn::Mul(hn::LoadU(d, row + j), scale), d, row + j);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_GEMM_INL_H_
