#pragma once
// Bias lowering helpers shared by the entry points.

#include "sdpa/sdpa.h"

namespace sdpa {

/// `params` with its AttnBias replaced by the bias's dense materialize(): what a backend
/// that does not run biases natively (MATH) receives. Returns `params` unchanged when the
/// mask already is dense or absent.
AttentionParams with_materialized_bias(const AttentionParams& params);

}  // namespace sdpa
