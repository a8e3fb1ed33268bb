#pragma once
// What forward and backward kernels write.

#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::detail {

/// Outputs of a forward kernel: out [B, Hq, L, Ev] (params.dtype) and lse [B, Hq, L]
/// (float32).
struct ForwardOutputs {
  Tensor out, lse;
};

/// Outputs of a backward kernel: grad_q [B, Hq, L, E], grad_k [B, Hkv, S, E],
/// grad_v [B, Hkv, S, Ev] (contiguous, params.dtype, preallocated), grad_mask
/// [B, Hq, L, S] when defined (the additive mask's gradient), and grad_captured, filled
/// by the kernel for a flex score_mod whose captured tensors require grad.
struct BackwardOutputs {
  Tensor grad_q, grad_k, grad_v, grad_mask;
  std::vector<Tensor> grad_captured;
};

}  // namespace sdpa::detail
