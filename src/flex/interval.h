#pragma once
// Interval analysis of a flex program over a block of (q_idx, kv_idx): a sound bound on
// every instruction's value, so a mask_mod can be proven all-true or all-false on a block
// without evaluating its elements.

#include <cstdint>
#include <vector>

#include "flex/node.h"

namespace sdpa::flex {

struct Interval {
  double lo;
  double hi;
};

/// What a mask_mod does on a block.
enum class BlockVerdict { kEmpty, kFull, kUnknown };

/// A block of a mod's index arguments: b and h fixed, q_idx in [q_lo, q_hi], kv_idx in
/// [kv_lo, kv_hi] (bounds included).
struct IndexBlock {
  int64_t b, h;
  int64_t q_lo, q_hi;
  int64_t kv_lo, kv_hi;
};

/// Bounds the program on `block` (score unbounded). Returns the verdict of a bool result:
/// kFull when provably true for every element, kEmpty when provably false, else kUnknown.
/// Float comparisons decide only with a relative margin, so float32 evaluation in the
/// kernels cannot disagree.
/// `reads_in_bounds`, when non-null, is set to whether every captured-tensor read of the
/// program provably stays inside its tensor on the block (false when it may not: the
/// caller must then evaluate the block's elements to find or rule out a bad read).
/// Values read from captured tensors off the CPU are unbounded (never read from the host),
/// as are reads of more than `max_scan` elements (their value range is not scanned).
BlockVerdict classify_block(const CompiledProgram& program, const std::vector<Captured>& captured,
                            const IndexBlock& block, bool* reads_in_bounds = nullptr,
                            int64_t max_scan = int64_t{1} << 16);

}  // namespace sdpa::flex
