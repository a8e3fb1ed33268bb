// The pieces of a rank's queries against a K/V slice under a global causal mask.

#include "distributed/pieces.h"

#include <algorithm>
#include <memory>

namespace sdpa::distributed {

std::vector<Piece> pieces(const std::vector<Segment>& q_segs, const std::vector<Segment>& kv_segs,
                          bool causal) {
  std::vector<Piece> out;
  for (const Segment& qs : q_segs) {
    for (const Segment& ks : kv_segs) {
      if (!causal) {
        out.push_back({qs.local, qs.local + qs.length, ks.local, ks.local + ks.length, nullptr});
        continue;
      }
      // Queries before the slice's first key see none of it; a piece whose keys all
      // precede its first query needs no mask, a diagonal one a top-left window whose
      // right edge is the offset of its first query from its first key.
      const int64_t skip = std::max<int64_t>(0, ks.start - qs.start);
      if (skip >= qs.length) continue;
      const int64_t first_query = qs.start + skip;
      const bool full = ks.start + ks.length - 1 <= first_query;
      AttnBiasPtr mask;
      if (!full) {
        mask = std::make_shared<LocalAttentionBias>(std::nullopt, first_query - ks.start,
                                                    DiagonalAlignment::kTopLeft);
      }
      out.push_back(
          {qs.local + skip, qs.local + qs.length, ks.local, ks.local + ks.length, mask});
    }
  }
  return out;
}

}  // namespace sdpa::distributed
