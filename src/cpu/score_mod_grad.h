#pragma once
// The scalar chain rule through a flex score_mod, shared by the row-wise backwards (MATH,
// float64 FLASH): one score's gradient before the score_mod, and its share of the
// captured tensors' gradients.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "flex/autodiff.h"
#include "flex/captured_grads.h"
#include "flex/eval_scalar.h"

namespace sdpa::cpu {

/// The derivative of a flex score_mod and the accumulator of its captured tensors'
/// gradients, shared by all threads of one backward call.
struct FlexBackward {
  flex::GradientProgram program;
  std::optional<flex::CapturedGrads> captured;
};

/// dL/d(score_mod's input) for score (b, h, i, j), given ds = dL/d(score_mod's output) and
/// the input `raw`; adds ds * d(score)/d(read) of every captured tensor read to `chunk` of
/// the captured gradients. `eval` runs grad.program (one per thread).
inline double chain_score_mod(FlexBackward& grad, flex::ScalarEvaluator& eval, double raw,
                              int64_t b, int64_t h, int64_t i, int64_t j, double ds,
                              int64_t chunk) {
  eval.run(raw, b, h, i, j);
  const flex::GradientProgram& g = grad.program;
  for (size_t r = 0; r < g.reads.size(); ++r) {
    int64_t index[8];
    for (size_t d = 0; d < g.reads[r].indices.size(); ++d) {
      index[d] = static_cast<int64_t>(eval.value(g.reads[r].indices[d]));
    }
    grad.captured->add(chunk, r, index, ds * eval.value(g.reads[r].adjoint));
  }
  return ds * eval.value(g.d_score);
}

}  // namespace sdpa::cpu
