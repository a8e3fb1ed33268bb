// The SIMD steps of the online softmax on a SoftmaxRows state (online_softmax.h has the
// state and its rules): the update of a score tile (SoftmaxTile), the accumulators'
// rescale, the flush of partial sums and the finish into out and lse. The AVX-512 fused
// tiles' variants (lazy_softmax-inl.h, softmax_bf16-inl.h) use RescaleFactors and
// NoFiniteScoreFill from here. Per-target code: include after foreach_target.h.

#if defined(SDPA_CPU_ONLINE_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_ONLINE_SOFTMAX_INL_H_
#undef SDPA_CPU_ONLINE_SOFTMAX_INL_H_
#else
#define SDPA_CPU_ONLINE_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/kernel_inline.h"
#include "cpu/fast_exp-inl.h"
#include "cpu/flash_tile.h"
#include "cpu/gemm-inl.h"
#include "cpu/online_softmax.h"
#include "cpu/reduce_lanes-inl.h"
#include "cpu/rows.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// row[0, n) *= factor; n a multiple of the vector width.
SDPA_INLINE void ScaleRow(float* HWY_RESTRICT row, int64_t n, float factor) {
  const hn::ScalableTag<float> d;
  const auto f = hn::Set(d, factor);
  for (int64_t j = 0; j < n; j += static_cast<int64_t>(hn::Lanes(d))) {
    hn::StoreU(hn::Mul(hn::LoadU(d, row + j), f), d, row + j);
  }
}

/// The factors by which rows' l and o are multiplied when their max goes from old_max to
/// new_max: e^(old - new), 0 for a row's first finite scores (its l and o are still 0), 1
/// while the row has none.
template <class D>
SDPA_INLINE hn::Vec<D> RescaleFactors(D d, hn::Vec<D> old_max, hn::Vec<D> new_max) {
  const auto seen = hn::Ne(new_max, hn::Set(d, kNegInf));
  return hn::IfThenElse(seen, FastExp(d, hn::Sub(old_max, new_max)), hn::Set(d, 1.0f));
}

/// The probability every key of [first, last) gets in a row without a finite score: 0, or
/// NaN when one of the scores is NaN, which makes the row NaN as in PyTorch (Highway's Max
/// may return the non-NaN operand, so the max cannot carry it).
SDPA_INLINE float NoFiniteScoreFill(const float* first, const float* last) {
  const bool nan = std::any_of(first, last, [](float x) { return std::isnan(x); });
  return nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
}

/// A tile's score rows for the softmax: row r at s + r * kBlockKv, r < rows, scores times
/// `scale` (> 0) in the softmax's units.
struct ScoreRows {
  float* s;
  int64_t rows;
  float scale;
};

/// Columns [first[k], last[k]) (whole vectors) of rows r0 + k; null: all kBlockKv.
struct RowSpans {
  const int64_t* first;
  const int64_t* last;
};

/// The max step of SoftmaxTile for rows [r0, r0 + N), N = Lanes: the rows' scores within
/// `spans` raise state.m; state.alpha gets the factors (RescaleFactors). Returns the new
/// maxes. Reduces the N rows by one tree (ReduceLanesTree), not one reduction per row.
/// With `slack` > 0 a row's m stays where the tile's scores exceed it by at most `slack`:
/// its probabilities then reach e^slack instead of 1, and alpha stays 1, so that o needs
/// no rescale (FlashAttention-4's conditional rescaling; the final o / l and lse are the
/// same). A NaN max is taken as before.
template <class D>
SDPA_INLINE hn::Vec<D> RaiseRowMaxes(D d, const ScoreRows& tile, int64_t r0, RowSpans spans,
                                     const SoftmaxRows& state, float slack = 0.0f) {
  using V = hn::Vec<D>;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(d));
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const V neg_inf = hn::Set(d, kNegInf);
  V v[N];
  for (int64_t k = 0; k < N; ++k) {
    v[k] = neg_inf;
    if (r0 + k >= tile.rows) continue;
    // Null spans leave constant bounds, which unroll.
    const int64_t lo = spans.first ? spans.first[k] : 0;
    const int64_t hi = spans.first ? spans.last[k] : kBlockKv;
    for (int64_t j = lo; j < hi; j += lanes) {
      v[k] = hn::Max(v[k], hn::LoadU(d, tile.s + (r0 + k) * kBlockKv + j));
    }
  }
  const V old_max = hn::LoadU(d, state.m + r0);
  V new_max = hn::Max(old_max, hn::Mul(ReduceLanesTree(d, v, MaxLanes()), hn::Set(d, tile.scale)));
  if (slack > 0.0f) {
    const auto raise = hn::Or(hn::Gt(new_max, hn::Add(old_max, hn::Set(d, slack))),
                              hn::IsNaN(new_max));
    new_max = hn::IfThenElse(raise, new_max, old_max);
  }
  hn::StoreU(RescaleFactors(d, old_max, new_max), d, state.alpha + r0);
  hn::StoreU(new_max, d, state.m + r0);
  return new_max;
}

/// Online-softmax update of a score tile's rows (Milakov & Gimelshein 2018;
/// FlashAttention-2): row r becomes unnormalized probabilities relative to the raised
/// state.m[r], state.l[r] is rescaled and increased, and state.alpha[r] gets the factor
/// that the caller applies to o (ApplyRescale). With `support`, row r can hold finite
/// scores only in columns [begin[r], end[r]); the work covers the vectors spanning them
/// and zeroes the rest. The state's m, l, alpha hold round_up(rows, Lanes) entries (rows
/// past `rows` keep -inf maxes).
SDPA_INLINE void SoftmaxTile(const ScoreRows& tile, const RowSupport* support,
                             const SoftmaxRows& state) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(d));
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float score_scale = tile.scale;
  for (int64_t r0 = 0; r0 < tile.rows; r0 += N) {
    int64_t first[N], last[N];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t r = r0 + k;
      first[k] = last[k] = 0;
      if (r < tile.rows) {
        first[k] = support ? support->begin[r] / lanes * lanes : 0;
        last[k] =
            support ? std::max(first[k], (support->end[r] + lanes - 1) / lanes * lanes) : kBlockKv;
      }
    }
    HWY_ALIGN float maxes[N];
    hn::Store(RaiseRowMaxes(d, tile, r0, {first, last}, state), d, maxes);
    const V c = hn::Set(d, score_scale * kLog2e);
    V v[N];
    for (int64_t k = 0; k < N; ++k) {
      const int64_t r = r0 + k;
      v[k] = hn::Zero(d);
      if (r >= tile.rows) continue;
      float* row = tile.s + r * kBlockKv;
      std::fill(row, row + first[k], 0.0f);
      std::fill(row + last[k], row + kBlockKv, 0.0f);
      if (!has_finite_score(maxes[k])) {
        const float fill = NoFiniteScoreFill(row + first[k], row + last[k]);
        std::fill(row + first[k], row + last[k], fill);
        v[k] = hn::Set(d, fill);
        continue;
      }
      const V m = hn::Set(d, maxes[k]);
      const V off = hn::Mul(m, hn::Set(d, kLog2e));
      for (int64_t j = first[k]; j < last[k]; j += lanes) {
        // Already scaled scores subtract the max first: exact for the huge finite values a
        // float mask may add (-1e30), where max * log2 e would overflow.
        const V x = hn::LoadU(d, row + j);
        const V e =
            score_scale == 1.0f ? FastExp(d, hn::Sub(x, m)) : FastExp2(d, hn::MulSub(x, c, off));
        hn::StoreU(e, d, row + j);
        v[k] = hn::Add(v[k], e);
      }
    }
    const V sums = ReduceLanesTree(d, v, AddLanes());
    hn::StoreU(hn::MulAdd(hn::LoadU(d, state.l + r0), hn::LoadU(d, state.alpha + r0), sums), d,
               state.l + r0);
  }
}

/// Multiplies rows [0, rows) of o by their factors state.alpha (where not 1), and of l
/// too with `with_l` (the softmax kernels rescale the l they update themselves).
SDPA_INLINE void ApplyRescale(const SoftmaxRows& state, int64_t rows, bool with_l) {
  for (int64_t r = 0; r < rows; ++r) {
    const float a = state.alpha[r];
    if (a == 1.0f) continue;
    ScaleRow(state.o + r * state.o_stride, state.o_stride, a);
    if (with_l) state.l[r] *= a;
  }
}

/// The float32 forward's rescale of `total` after a key tile: l at once, o deferred by
/// multiplying its factor into o_scale[r], which AddPartial applies when it next reads
/// the row; a tile that raises a row's max then costs no pass over the output row.
SDPA_INLINE void DeferRescale(const SoftmaxRows& total, int64_t rows, float* HWY_RESTRICT o_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    total.l[r] *= total.alpha[r];
    o_scale[r] *= total.alpha[r];
  }
}

/// Adds rows [0, rows) of `partial`'s l into `total`'s, and with `o_scale` its o too,
/// total.o row r first multiplied by o_scale[r] (DeferRescale's factors, reset to 1 here),
/// zeroing what it added: two states sharing m, so that `total` takes one rounding per
/// flush instead of one per key tile.
SDPA_INLINE void AddPartial(const SoftmaxRows& partial, const SoftmaxRows& total, int64_t rows,
                            float* HWY_RESTRICT o_scale) {
  const hn::ScalableTag<float> d;
  for (int64_t r = 0; r < rows && o_scale; ++r) {
    const auto scale = hn::Set(d, o_scale[r]);
    float* HWY_RESTRICT to = total.o + r * total.o_stride;
    float* HWY_RESTRICT from = partial.o + r * partial.o_stride;
    for (int64_t j = 0; j < total.o_stride; j += static_cast<int64_t>(hn::Lanes(d))) {
      hn::StoreU(hn::MulAdd(hn::LoadU(d, to + j), scale, hn::LoadU(d, from + j)), d, to + j);
      hn::StoreU(hn::Zero(d), d, from + j);
    }
    o_scale[r] = 1.0f;
  }
  for (int64_t r = 0; r < rows; ++r) {
    total.l[r] += partial.l[r];
    partial.l[r] = 0.0f;
  }
}

/// Resets rows [0, rows) of the state to no key seen: m = -inf, l = 0, o = 0; m and l
/// through round_up(rows, kMaxLanes), as the SIMD softmaxes read whole vectors of rows.
SDPA_INLINE void ResetRows(const SoftmaxRows& state, int64_t rows) {
  const int64_t padded = round_up(rows, kMaxLanes);
  std::fill(state.m, state.m + padded, kNegInf);
  std::fill(state.l, state.l + padded, 0.0f);
  std::fill(state.o, state.o + rows * state.o_stride, 0.0f);
}

/// Ends rows [0, rows) (finalize): query row i0 + r of `out_rows` gets o / l, or 0 for a
/// fully masked row, and lse[r] its logsumexp. o is normalized in place. The logsumexps
/// m + log(l) come from float64 vectors (the log of the float l, then one rounding): a
/// libm logf per row took 4% of a one-tile q-block's time (sparse masks, short rows).
SDPA_INLINE void FinishRows(const SoftmaxRows& state, int64_t rows, const RowView& out_rows,
                            int64_t i0, float* HWY_RESTRICT lse) {
  const hn::ScalableTag<double> dd;
  constexpr size_t kLanes = hn::MaxLanes(dd);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  HWY_ALIGN double m[kLanes], l[kLanes], logsumexp[kLanes];
  for (int64_t r0 = 0; r0 < rows; r0 += lanes) {
    const int64_t n = std::min(lanes, rows - r0);
    for (int64_t i = 0; i < lanes; ++i) {
      m[i] = i < n ? state.m[r0 + i] : 0.0;
      l[i] = i < n ? state.l[r0 + i] : 1.0;
    }
    hn::Store(hn::Add(hn::Load(dd, m), hn::Log(dd, hn::Load(dd, l))), dd, logsumexp);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = r0 + i;
      float* o = state.o + r * state.o_stride;
      // Highway's Log does not propagate NaN: rows with a NaN or infinite m or l (NaN
      // inputs, overflowing score_mods, rows without a visible key) take libm's.
      const bool finite = std::isfinite(state.l[r]) && std::isfinite(state.m[r]);
      const RowFinish<float> end =
          finite ? finalize_with_lse(state.l[r], static_cast<float>(logsumexp[i]))
                 : finalize(state.m[r], state.l[r]);
      if (end.masked) {
        std::fill(o, o + state.o_stride, 0.0f);
      } else {
        ScaleRow(o, state.o_stride, end.inv_l);
      }
      lse[r] = end.lse;
      out_rows.store(i0 + r, o);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_ONLINE_SOFTMAX_INL_H_
