#pragma once
// Saturating int64 arithmetic for positions built from user-given extents: a window of
// INT64_MAX keys or a diagonal offset near the sequence limits must clamp, not wrap (signed
// overflow is undefined behaviour, and wrapped bounds mask every key).

#include <cstdint>
#include <limits>

namespace sdpa::detail {

/// a + b, clamped to [INT64_MIN, INT64_MAX].
inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

/// a - b, clamped to [INT64_MIN, INT64_MAX].
inline int64_t saturating_sub(int64_t a, int64_t b) {
  int64_t difference;
  if (!__builtin_sub_overflow(a, b, &difference)) return difference;
  return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

}  // namespace sdpa::detail
