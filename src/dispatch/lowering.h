#pragma once
// Bias lowering helpers shared by the entry points.

#include "sdpa/sdpa.h"

namespace sdpa {

/// `params` with its AttnBias replaced by the bias's dense materialize() (float32 for
/// half-precision calls, as the fused kernels add biases in float32): what a backend
/// that does not run biases natively (MATH) receives. Returns `params` unchanged when the
/// mask already is dense or absent.
AttentionParams with_materialized_bias(const AttentionParams& params);

/// Selects a backend for the backward `params` and runs it; `attn_mask` is the caller's
/// mask tensor (for reducing grad_attn_mask to its shape).
AttentionGradients run_backward(const AttentionParams& params, const Tensor& attn_mask);

/// Selects a backend for the forward `params` and runs it.
AttentionResult run_forward(const AttentionParams& params);

}  // namespace sdpa
