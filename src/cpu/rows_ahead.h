#pragma once
// The next tile's value rows, which the decode path's P.v passes request into L2 while they
// read their own tile's (flash_decode_tile.cc): memory then streams values during P.v and
// keys during the scores, instead of idling through P.v.

#include <algorithm>
#include <cstdint>

namespace sdpa::cpu {

/// Rows [0, n), `rows` the first one's address (null when n is 0), spaced like the value
/// rows being read, of `element_bytes`-byte elements.
struct RowsAhead {
  const void* rows = nullptr;
  int64_t n = 0;
  int64_t element_bytes = 2;
};

/// Requests rows [begin, min(end, ahead.n)) of `ahead`, `elements` each, `row_stride`
/// elements apart (prefetcht1, as the decode tile loop requests its rows).
inline void PrefetchRows(const RowsAhead& ahead, int64_t row_stride, int64_t elements,
                         int64_t begin, int64_t end) {
  const char* first = static_cast<const char*>(ahead.rows);
  for (int64_t c = begin; c < std::min(end, ahead.n); ++c) {
    for (int64_t offset = 0; offset < elements * ahead.element_bytes; offset += 64) {
      __builtin_prefetch(first + (c * row_stride) * ahead.element_bytes + offset, 0, 2);
    }
  }
}

}  // namespace sdpa::cpu
