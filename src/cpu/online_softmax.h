#pragma once
// The online softmax of attention rows (Milakov & Gimelshein 2018; FlashAttention-2, Dao
// 2023): its state and every rule about -inf and NaN, in one place. Per row the state is
// {m, l, o}: m the running max of the scores seen (scaled units), l = sum_j e^(s_j - m) and
// o = sum_j e^(s_j - m) v_j, unnormalized. The rules, which every CPU kernel (forward
// tiles, split-KV decode, MATH, merge_attention_states, the backward's lse) follows:
//   - no finite score seen: m = -inf, l = 0, o = 0; such a row ends fully masked (out 0,
//     lse -inf), and the backward sends no gradient through it;
//   - a NaN score makes its row's m or l NaN, and so its out and lse NaN, as PyTorch's
//     softmax does;
//   - raising m from m_old to m_new multiplies l and o by rescale_factor(m_old, m_new).
// The SIMD versions of these steps are in online_softmax-inl.h.

#include <cmath>
#include <cstdint>
#include <limits>

namespace sdpa::cpu {

/// max(running, x), NaN once either is NaN. std::max(m, NaN) returns m, which would let a
/// row of NaN scores pass for fully masked or drop a NaN key.
template <class T>
inline T max_keeping_nan(T running, T x) {
  return (x > running || std::isnan(x)) ? x : running;
}

/// Whether a row whose running max is m has seen a finite score (else its probabilities
/// are all 0, or NaN when a score is NaN).
template <class T>
inline bool has_finite_score(T m) {
  return m != -std::numeric_limits<T>::infinity();
}

/// The logsumexp of a fully masked row.
template <class T>
inline constexpr T kMaskedLse = -std::numeric_limits<T>::infinity();

/// Whether a forward's lse marks its row fully masked (the backward then sends no
/// gradient through the row).
template <class T>
inline bool is_masked_lse(T lse) {
  return lse == kMaskedLse<T>;
}

/// A row's end state: out = o * inv_l unless `masked` (out = 0), and its lse.
template <class T>
struct RowFinish {
  bool masked;
  T inv_l;
  T lse;
};

/// finalize(m, l) → how o becomes out, and the lse. l > 0 normalizes; l = 0 (no visible
/// key) is a fully masked row, whose o is not read (0 * an infinite value would be NaN);
/// a NaN l keeps the row NaN.
template <class T>
inline RowFinish<T> finalize_with_lse(T l, T lse);

template <class T>
inline RowFinish<T> finalize(T m, T l) {
  return finalize_with_lse(l, m + std::log(l));
}

/// finalize(m, l) with the lse m + log(l) computed by the caller (vector logs for a block
/// of rows); the lse is not read for a fully masked row.
template <class T>
inline RowFinish<T> finalize_with_lse(T l, T lse) {
  if (l <= T(0)) return {true, T(0), kMaskedLse<T>};
  return {false, T(1) / l, lse};
}

/// Whether a partial state (a split-KV chunk, one side of merge_attention_states) with
/// sum l contributes to a merge: l = 0 is a partial without visible keys, whose o is not
/// read. A NaN l contributes (and makes the merge NaN).
template <class T>
inline bool contributes(T l) {
  return !(l <= T(0));
}

/// The partial state of a normalized result: merge_attention_states' inputs (out, lse) are
/// the states {m = lse, l = 1, o = out}, or empty for a fully masked row.
template <class T>
struct LsePartial {
  T m;
  T l;
};
template <class T>
inline LsePartial<T> partial_from_lse(T lse) {
  return {lse, is_masked_lse(lse) ? T(0) : T(1)};
}

/// Merges partial states {m_c, l_c, o_c} of one row in two passes: see() every partial,
/// then weight(m_c) multiplies each contributing partial's l_c and o_c; the sums go to
/// finalize(max(), l). (FlashDecoding, Dao et al. 2023; FlashInfer's
/// merge_attention_states.)
template <class T>
class PartialMerge {
 public:
  /// First pass: the merged max. A partial with a NaN sum (NaN scores; its m may be -inf
  /// when every score was NaN) makes the max, and so the row, NaN.
  void see(T m, T l) {
    if (contributes(l)) max_ = max_keeping_nan(max_, std::isnan(l) ? l : m);
  }
  T max() const { return max_; }
  /// Whether no partial contributes: the row is fully masked.
  bool empty() const { return !has_finite_score(max_) && !std::isnan(max_); }
  /// Second pass: the factor of a contributing partial with max m.
  T weight(T m) const { return std::exp(m - max_); }

 private:
  T max_ = -std::numeric_limits<T>::infinity();
};

/// The online-softmax state of a block of rows, as arrays: m, l and alpha of
/// round_up(rows, lanes) entries (SIMD softmaxes read whole vectors of rows), o of rows of
/// o_stride floats. alpha[r] is the factor of the latest update of row r (rescale_factor),
/// which the kernel applies to o (and to other accumulators sharing m). l_lanes, when not
/// null, holds per row 16 lanes of sum not yet in l (the fused AVX-512 tiles add to lanes
/// and fold them into l once, lazy_softmax-inl.h).
struct SoftmaxRows {
  float* m;
  float* l;
  float* alpha;
  float* o;
  int64_t o_stride;
  float* l_lanes = nullptr;

  /// The state of rows [r, ...).
  SoftmaxRows from(int64_t r) const {
    return {m + r, l + r, alpha + r, o ? o + r * o_stride : nullptr, o_stride,
            l_lanes ? l_lanes + 16 * r : nullptr};
  }
};

}  // namespace sdpa::cpu
