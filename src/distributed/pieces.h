#pragma once
// The pieces of a rank's queries against one K/V slice under a causal mask over global
// positions (as python/sdpa/distributed/pieces.py, band and causal only): each a run of
// local query rows against a run of local key rows, with the mask of one native call.

#include <cstdint>
#include <vector>

#include "sdpa/attn_bias.h"
#include "sdpa/context_parallel_mpi.h"

namespace sdpa::distributed {

/// Local query rows [q0, q1) against local key rows [k0, k1) under `mask` (null: all).
struct Piece {
  int64_t q0, q1, k0, k1;
  AttnBiasPtr mask;
};

/// The pieces of the queries of q_segs against the keys of kv_segs; `causal`: query
/// position i sees key position j <= i, else every key.
std::vector<Piece> pieces(const std::vector<Segment>& q_segs, const std::vector<Segment>& kv_segs,
                          bool causal);

}  // namespace sdpa::distributed
