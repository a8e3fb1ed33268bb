#pragma once
// The pieces of a rank's queries against one K/V slice under a mask over global positions
// (as python/sdpa/distributed/pieces.py): each a run of local query rows against a run of
// local key rows of one document, with the mask of one native call.

#include <cstdint>
#include <optional>
#include <vector>

#include "sdpa/attn_bias.h"
#include "sdpa/context_parallel_mpi.h"

namespace sdpa::distributed {

/// A mask over the global positions of a self-attention (L = S): query i sees keys j with
/// i - left <= j <= i + right (absent: unbounded; causal is right = 0), and, with
/// documents (cu_seqlens non-empty), only keys of its own document.
struct GlobalMask {
  std::optional<int64_t> left, right;
  std::vector<int64_t> cu_seqlens;
};

/// The GlobalMask of `options` (is_causal or attn_mask) over `total` positions. Throws
/// sdpa::Error naming attn_mask for masks that are not bands and documents over global
/// positions, and for is_causal together with attn_mask.
GlobalMask global_mask(const ContextParallelOptions& options, int64_t total);

/// Local query rows [q0, q1) against local key rows [k0, k1) under `mask` (null: all);
/// q_start / k_start: the global positions of rows q0 and k0 (dropout's draws).
struct Piece {
  int64_t q0, q1, k0, k1;
  AttnBiasPtr mask;
  int64_t q_start, k_start;
};

/// The pieces of the queries of q_segs against the keys of kv_segs under `mask`. No piece
/// has a row without keys, and together they cover every (query, key) pair the mask keeps
/// exactly once.
std::vector<Piece> pieces(const std::vector<Segment>& q_segs, const std::vector<Segment>& kv_segs,
                          const GlobalMask& mask);

}  // namespace sdpa::distributed
