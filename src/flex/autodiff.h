#pragma once
// Symbolic reverse-mode differentiation of a score_mod program.

#include <memory>
#include <vector>

#include "flex/node.h"

namespace sdpa::flex {

/// One program computing, per element, d(score_mod)/d(score) and, for every captured
/// float tensor that requires grad, d(score_mod)/d(read) together with the read's indices
/// (so the caller can scatter dS * derivative into the tensor's gradient).
struct GradientProgram {
  std::shared_ptr<const CompiledProgram> program;
  std::vector<Captured> captured;
  int32_t d_score = -1;  // output instruction
  struct ReadGrad {
    int32_t forward_slot;          // index into the score_mod's Program::captured()
    int32_t adjoint;               // instruction: d(score_mod)/d(read value)
    std::vector<int32_t> indices;  // instructions: the read's index expressions
  };
  std::vector<ReadGrad> reads;

  /// `program` with its reads renumbered to the slots of `forward` (the score_mod's
  /// Program::captured()), so one captured array serves the score_mod and its derivative.
  CompiledProgram in_slots_of(const std::vector<Captured>& forward) const;
};

/// Differentiates `score_mod`. Throws sdpa::Error when its result does not depend
/// differentiably on score (ignores score, or reaches it only through comparisons).
GradientProgram differentiate(const Program& score_mod);

}  // namespace sdpa::flex
