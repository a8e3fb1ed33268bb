#pragma once
// Host side of a MATH launch with flex programs on CUDA: the programs (and, in the
// backward, the score_mod's derivative) copied for the interpreter, the BlockMask as block
// states and the failure records, on the call's device.

#include "cuda/flex_device_program.h"
#include "cuda/math_flex.cuh"
#include "dispatch/backend_impl.h"

namespace sdpa::cuda::math {

/// A flex call's parts on the device, alive as long as this is (until the launches that
/// read them have run: check() waits for them).
class FlexParts {
 public:
  /// `backward`: also d(score_mod)/d(score) (throws sdpa::Error, as the CPU, when the
  /// score_mod has no derivative).
  FlexParts(const AttentionParams& p, bool backward);

  /// Raises the first recorded failure of the score_mod, its derivative or the mask_mod
  /// as sdpa::Error; waits for the call's stream, unless none of them can fail
  /// (program_may_fail).
  void check(const AttentionParams& p) const;

  /// What the kernels read.
  FlexMask mask{};

 private:
  DeviceProgram score_program_, grad_program_, mask_program_;
  bool may_fail_ = false;
  Tensor states_, status_;
};

}  // namespace sdpa::cuda::math
