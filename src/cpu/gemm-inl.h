// Register-blocked float32 GEMM for attention tiles: C[M, N] (+)= A[M, K] . B[K, N], B and
// C row-major, N a multiple of the vector width; A is read through two strides, so a
// transposed A (P^T, dS^T in the backward) needs no copy. Serves q.k^T (B = packed k^T),
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
HWY_INLINE void GemmMicroTile(const float* HWY_RESTRICT a, int64_t lda, int64_t a_step,
                              const float* HWY_RESTRICT b, int64_t ldb, float* HWY_RESTRICT c,
                              int64_t ldc, int64_t depth, bool accumulate) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
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
    for (int64_t v = 0; v < kVecs; ++v) bv[v] = hn::LoadU(d, b + k * ldb + v * lanes);
    for (int64_t r = 0; r < kRows; ++r) {
      const V av = hn::Set(d, a[r * lda + k * a_step]);
      for (int64_t v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t v = 0; v < kVecs; ++v) {
      float* out = c + r * ldc + v * lanes;
      hn::StoreU(accumulate ? hn::Add(hn::LoadU(d, out), acc[r][v]) : acc[r][v], d, out);
    }
  }
}

// All row blocks of one column panel of kVecs vectors.
template <int64_t kVecs>
HWY_INLINE void GemmPanel(int64_t m, const float* a, int64_t lda, int64_t a_step, const float* b,
                          int64_t ldb, float* c, int64_t ldc, int64_t depth, bool accumulate) {
  int64_t r = 0;
  for (; r + kGemmRows <= m; r += kGemmRows) {
    GemmMicroTile<kGemmRows, kVecs>(a + r * lda, lda, a_step, b, ldb, c + r * ldc, ldc, depth,
                                    accumulate);
  }
  // The remaining rows in one shorter micro-tile (one row at a time would make the loop
  // load-bound: one broadcast per kVecs FMAs).
  const int64_t left = m - r;
  a += r * lda;
  c += r * ldc;
#define SDPA_GEMM_ROWS_TAIL(R) \
  return GemmMicroTile<R, kVecs>(a, lda, a_step, b, ldb, c, ldc, depth, accumulate)
  switch (left) {
    case 1: SDPA_GEMM_ROWS_TAIL(1);
    case 2: SDPA_GEMM_ROWS_TAIL(2);
    case 3: SDPA_GEMM_ROWS_TAIL(3);
    case 4: SDPA_GEMM_ROWS_TAIL(4);
    case 5: SDPA_GEMM_ROWS_TAIL(5);
    default: return;
  }
#undef SDPA_GEMM_ROWS_TAIL
}

/// C[m, n] = A[m, depth] . B[depth, n] (+ C when accumulate); n % Lanes == 0. A[r][k] is
/// a[r * lda + k * a_step]: a_step = 1 is row-major, lda = 1 reads a transposed matrix.
HWY_INLINE void Gemm(int64_t m, int64_t n, int64_t depth, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate,
                     int64_t a_step = 1) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t vecs = n / lanes;
  int64_t v = 0;
  for (; v + kGemmVecs <= vecs; v += kGemmVecs) {
    GemmPanel<kGemmVecs>(m, a, lda, a_step, b + v * lanes, ldb, c + v * lanes, ldc, depth,
                         accumulate);
  }
  // The remaining vectors in one narrower panel (one vector per panel would make the loop
  // broadcast-bound: kGemmRows broadcasts per kGemmRows FMAs).
  const float* bv = b + v * lanes;
  float* cv = c + v * lanes;
#define SDPA_GEMM_VECS_TAIL(V) \
  return GemmPanel<V>(m, a, lda, a_step, bv, ldb, cv, ldc, depth, accumulate)
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
HWY_INLINE void PanelSupport(const RowSupport& support, int64_t r, int64_t rows, int64_t& lo,
                             int64_t& hi) {
  lo = INT64_MAX;
  hi = 0;
  for (int64_t i = r; i < r + rows; ++i) {
    if (support.begin[i] >= support.end[i]) continue;
    lo = std::min(lo, support.begin[i]);
    hi = std::max(hi, support.end[i]);
  }
}

/// S[m, kBlock] = A[m, depth] . B[depth, kBlock], computing for each panel of kGemmRows
/// rows only the vectors covering its rows' support; the other entries are left as they
/// were (the caller masks them). A triangle or band edge crossing the tile costs about
/// half a tile instead of a whole one.
HWY_INLINE void GemmRowSupport(int64_t m, int64_t n, int64_t depth, const float* a, int64_t lda,
                               const float* b, int64_t ldb, float* c, int64_t ldc,
                               const RowSupport& support) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < m; r += kGemmRows) {
    const int64_t rows = std::min(kGemmRows, m - r);
    int64_t lo, hi;
    PanelSupport(support, r, rows, lo, hi);
    if (lo >= hi) continue;
    lo = lo / lanes * lanes;
    hi = std::min(n, (hi + lanes - 1) / lanes * lanes);
    Gemm(rows, hi - lo, depth, a + r * lda, lda, b + lo, ldb, c + r * ldc + lo, ldc, false);
  }
}

/// C[m, n] += P[m, kBlock] . B[kBlock, n] where row r of P is zero outside its support:
/// each panel of kGemmRows rows runs over the union of its rows' support only.
HWY_INLINE void GemmAccumulateRowSupport(int64_t m, int64_t n, const float* p, int64_t ldp,
                                         const float* b, int64_t ldb, float* c, int64_t ldc,
                                         const RowSupport& support) {
  for (int64_t r = 0; r < m; r += kGemmRows) {
    const int64_t rows = std::min(kGemmRows, m - r);
    int64_t lo, hi;
    PanelSupport(support, r, rows, lo, hi);
    if (lo >= hi) continue;
    Gemm(rows, n, hi - lo, p + r * ldp + lo, ldp, b + lo * ldb, ldb, c + r * ldc, ldc, true);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_GEMM_INL_H_
