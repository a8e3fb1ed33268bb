#pragma once
// Everything a kernel thread needs to apply a call's flex program and BlockMask to score
// rows: lane buffers for the vector evaluator, scalar evaluators for MATH, block lookup.

#include <optional>

#include "flex/block_lookup.h"
#include "flex/partial_bits.h"
#include "flex/row_buffers.h"
#include "sdpa/flex.h"
#include "sdpa/params.h"

namespace sdpa::flex {

struct RowState {
  RowState(const MaskDescriptor& mask, int64_t lanes) : blocks(mask.block_mask.get()) {
    if (mask.score_mod) {
      score_mod.emplace(*mask.score_mod->compiled(), mask.score_mod->captured(), lanes);
    }
    if (mask.block_mask && mask.block_mask->mask_mod) {
      const Program& m = *mask.block_mask->mask_mod;
      mask_mod.emplace(*m.compiled(), m.captured(), lanes);
    }
  }
  bool active() const { return score_mod.has_value() || blocks.active(); }

  std::optional<RowBuffers> score_mod;
  std::optional<RowBuffers> mask_mod;
  BlockMaskLookup blocks;
  /// The call's shared bits of partial blocks (partial_bits-inl.h), when the kernel made
  /// them; null: mask_mod is evaluated at every visit.
  PartialBlockBits* partial_bits = nullptr;
};

}  // namespace sdpa::flex
