// Lanewise reduction of Lanes(d) vectors at once: lane k of the result reduces vector k's
// lanes. A tree of interleaves (log2 N levels) in place of N horizontal reductions, whose
// shuffles and dependency chains dominate when each vector is short work (the scores of
// a few query rows; the per-row max and sum of a softmax tile). Per-target code: include
// after foreach_target.h.

#if defined(SDPA_CPU_REDUCE_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_REDUCE_LANES_INL_H_
#undef SDPA_CPU_REDUCE_LANES_INL_H_
#else
#define SDPA_CPU_REDUCE_LANES_INL_H_
#endif

#include "core/kernel_inline.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

struct AddLanes {
  template <class V>
  SDPA_INLINE V operator()(V a, V b) const {
    return hn::Add(a, b);
  }
};
struct MaxLanes {
  template <class V>
  SDPA_INLINE V operator()(V a, V b) const {
    return hn::Max(a, b);
  }
};

// GCC 12's AVX-512 intrinsics behind the interleaves trip -Wmaybe-uninitialized; see
// bf16_dot.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// Lane k of the result = op over the lanes of v[k], for k < N = Lanes(d); `op` is
/// associative and commutative (AddLanes, MaxLanes).
template <class D, class Op>
SDPA_INLINE hn::Vec<D> ReduceLanesTree(D d, const hn::Vec<D>* v, Op op) {
#if HWY_TARGET == HWY_SCALAR
  (void)d;
  (void)op;
  return v[0];
#else
  using V = hn::Vec<D>;
  constexpr size_t N = hn::MaxLanes(d);
  static_assert(N == 4 || N == 8 || N == 16, "ReduceLanesTree: 128-bit blocks of 4 floats");
  const hn::Repartition<uint64_t, D> d64;
  V t[N / 2];  // per 128-bit block: pairwise reductions of v[2k] and v[2k + 1]
  for (size_t k = 0; k < N / 2; ++k) {
    t[k] = op(hn::InterleaveLower(d, v[2 * k], v[2 * k + 1]),
              hn::InterleaveUpper(d, v[2 * k], v[2 * k + 1]));
  }
  V u[N / 4];  // u[m], block j: block j's reductions of v[4m] .. v[4m + 3]
  for (size_t m = 0; m < N / 4; ++m) {
    const auto x = hn::BitCast(d64, t[2 * m]), y = hn::BitCast(d64, t[2 * m + 1]);
    u[m] = op(hn::BitCast(d, hn::InterleaveLower(d64, x, y)),
              hn::BitCast(d, hn::InterleaveUpper(d64, x, y)));
  }
  if constexpr (N == 4) {
    return u[0];
  } else if constexpr (N == 8) {
    return op(hn::ConcatLowerLower(d, u[1], u[0]), hn::ConcatUpperUpper(d, u[1], u[0]));
  } else {
#if HWY_TARGET == HWY_AVX3
    const V v01 = op(hn::ConcatLowerLower(d, u[1], u[0]), hn::ConcatUpperUpper(d, u[1], u[0]));
    const V v23 = op(hn::ConcatLowerLower(d, u[3], u[2]), hn::ConcatUpperUpper(d, u[3], u[2]));
    // Even and odd 128-bit blocks of (v01, v23).
    return op(V{_mm512_shuffle_f32x4(v01.raw, v23.raw, _MM_SHUFFLE(2, 0, 2, 0))},
              V{_mm512_shuffle_f32x4(v01.raw, v23.raw, _MM_SHUFFLE(3, 1, 3, 1))});
#endif
  }
#endif
}
#pragma GCC diagnostic pop

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_REDUCE_LANES_INL_H_
