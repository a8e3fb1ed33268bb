#pragma once
// Recognizes mask_mods that are diagonal bands: conjunctions of comparisons between
// q_idx - kv_idx and constants (causal, sliding windows, their offsets), so that backends
// with native band masking (cuDNN's causal and sliding-window kernels, which skip the
// tiles outside the band) run a BlockMask of such a mask_mod without evaluating it.
// Exact: the band keeps precisely the (q_idx, kv_idx) the program keeps, for any indices.

#include <optional>

#include "sdpa/flex.h"
#include "sdpa/params.h"

namespace sdpa::flex {

/// The band of `mask_mod` (top-left, sequence frame: key kv_idx of query q_idx is kept
/// when q_idx - left <= kv_idx <= q_idx + right), or nothing when the program is not one:
/// it reads b, h or a captured tensor, or combines comparisons in other ways than AND
/// (an OR of overlapping bands, a NOT of a one-sided bound and integer constants are
/// accepted), or compares with a coefficient on q_idx - kv_idx other than +1 / -1. A
/// program that keeps nothing gives nothing; one that keeps every key gives a band
/// without bounds.
std::optional<DiagonalBand> band_of_mask_mod(const Program& mask_mod);

/// Whether `blocks` run exactly `band` (the band of its mask_mod): every block that
/// meets the band is listed (partial or full), every full block lies inside it, and no
/// unlisted block meets it. Blocks listed partial outside the band are harmless (their
/// mask_mod keeps nothing). O(blocks).
bool block_lists_follow_band(const BlockMask& blocks, const DiagonalBand& band);

}  // namespace sdpa::flex
