#pragma once
// The running row max of the scalar softmaxes (MATH, the decode merge), keeping NaN as
// PyTorch's softmax does: a NaN score makes its row's max, and so its output and
// logsumexp, NaN. std::max(m, NaN) returns m, which would let the row pass for fully
// masked (all scores NaN) or drop the NaN key.

#include <cmath>

namespace sdpa::cpu {

/// max(running, x), NaN once either is NaN.
template <class T>
inline T max_keeping_nan(T running, T x) {
  return (x > running || std::isnan(x)) ? x : running;
}

}  // namespace sdpa::cpu
