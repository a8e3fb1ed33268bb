#pragma once
// MATH on CUDA tensors: the GPU reference and last resort. Exact softmax per query row in
// float32 (float64 for float64 inputs), reading q/k/v/mask through their strides, with the
// CPU kernels' Philox dropout layout, so a (seed, offset) drops the same elements on the
// CPU and the GPU.

#include "dispatch/backend_impl.h"

namespace sdpa::cuda {

/// Largest head dim (E and Ev) MATH on CUDA takes.
inline constexpr int kMathMaxHeadDim = 1024;

/// Whether MATH can run `params` on its CUDA device (else adds the reason).
bool math_supports(const AttentionParams& params, Reasons& reasons);
/// Forward: out [B, Hq, L, Ev] and lse [B, Hq, L] (contiguous, on the device).
void math_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse);
/// Backward into preallocated contiguous device gradients (grad_mask when defined).
void math_backward(const AttentionParams& params, sdpa::detail::BackwardOutputs& outputs);
/// Sets every byte of contiguous device tensor `t` to zero, ordered on `stream`.
void fill_zeros(const Tensor& t, void* stream);

}  // namespace sdpa::cuda
