#pragma once
// Bias lowering helpers shared by the entry points.

#include "sdpa/sdpa.h"

namespace sdpa {

/// Whether every backend runs the call's AttnBias from its native descriptor: with a flex
/// score_mod, whose input takes the bias's additive terms (ALiBi) and whose output its
/// masks then act on, one dense tensor cannot stand for a bias that has both (a composed
/// ALiBi + causal would turn masked keys into score_mod(-inf), e.g. a soft-cap's -cap).
bool bias_stays_native(const AttentionParams& params);

/// `params` with its AttnBias replaced by the bias's dense materialize() (float32 for
/// half-precision calls, as the fused kernels add biases in float32): what a backend
/// that does not run biases natively (MATH) receives. Returns `params` unchanged when the
/// mask already is dense or absent, or when bias_stays_native(params).
AttentionParams with_materialized_bias(const AttentionParams& params);

/// Selects a backend for the backward `params` and runs it; `attn_mask` is the caller's
/// mask tensor (for reducing grad_attn_mask to its shape).
AttentionGradients run_backward(const AttentionParams& params, const Tensor& attn_mask);

/// Selects a backend for the forward `params` and runs it.
AttentionResult run_forward(const AttentionParams& params);

}  // namespace sdpa
