#pragma once
// The next tile's value rows, which the decode path's P.v passes request into L2 while they
// read their own tile's (flash_decode_tile.cc): memory then streams values during P.v and
// keys during the scores, instead of idling through P.v.

#include <algorithm>
#include <cstdint>

namespace sdpa::cpu {

/// Rows [0, n) of 16-bit elements, `rows` the first one's address (null when n is 0),
/// spaced like the value rows being read.
struct RowsAhead {
  const uint16_t* rows = nullptr;
  int64_t n = 0;
};

/// Requests rows [begin, min(end, ahead.n)) of `ahead`, `elements` each, `row_stride`
/// elements apart (prefetcht1, as the decode tile loop requests its rows).
inline void PrefetchRows(const RowsAhead& ahead, int64_t row_stride, int64_t elements,
                         int64_t begin, int64_t end) {
  const char* first = reinterpret_cast<const char*>(ahead.rows);
  for (int64_t c = begin; c < std::min(end, ahead.n); ++c) {
    for (int64_t offset = 0; offset < elements * 2; offset += 64) {
      __builtin_prefetch(first + c * row_stride * 2 + offset, 0, 2);
    }
  }
}

}  // namespace sdpa::cpu
