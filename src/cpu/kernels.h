#pragma once
// CPU attention kernels. Each writes out [B, Hq, L, Ev] (contiguous, params.dtype) and
// lse [B, Hq, L] (contiguous float32) completely.

#include "core/threading.h"
#include "dispatch/kernel_io.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// MATH: materializes the [L, S] scores per (batch, head); accumulates in float64 for
/// float64 inputs and in float32 otherwise. The reference every other backend is
/// checked against.
void math_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse);

/// MATH for float16 / bfloat16 with every intermediate rounded to the input dtype, as
/// torch's math path without its float32 upcast (params.reduced_precision_math).
void math_forward_reduced(const AttentionParams& params, const Tensor& out, const Tensor& lse);

/// The maximum of each query row's scores as MATH softmaxes them (biases, score_mod and
/// masks applied; float64 for float64 inputs) into max_scores float32 [B, Hq, L]
/// (contiguous): -inf for a row that keeps no key, NaN where a kept score is NaN.
void math_max_scores(const AttentionParams& params, const Tensor& max_scores);

/// FLASH_ATTENTION on CPU: tiled online softmax (Dao et al., FlashAttention-2, 2023) that
/// never materializes L x S; SIMD level from get_cpu_capability(), OpenMP across
/// (batch, head, q-block). float32/bfloat16/float16 inputs compute in float32; float64
/// inputs in float64 (flash_f64.h).
void flash_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse);

/// Backward kernels read params.grad_out/out/lse and write `outputs` (kernel_io.h).
///
/// MATH backward: probabilities recomputed per row; the reference for FLASH.
void math_backward(const AttentionParams& params, detail::BackwardOutputs& outputs);

/// FLASH backward on CPU: FlashAttention-2's backward with P recomputed from lse tile by
/// tile, never materializing L x S. Two passes keep it deterministic without atomics:
/// dK/dV parallel over (batch, kv head, kv block), then dQ over (batch, head, q block).
void flash_backward(const AttentionParams& params, detail::BackwardOutputs& outputs);

/// The work of the forward (backward) of `params`, which sizes the kernels' thread teams:
/// the FLOPs of its matrix products and the bytes of k and v (masks not counted, so a
/// causal call is over-estimated twofold, which matters only near the grain).
detail::Work forward_work(const AttentionParams& params);
detail::Work backward_work(const AttentionParams& params);

}  // namespace sdpa::cpu
