#pragma once
// flex_attention: scaled dot-product attention with a score_mod program and a BlockMask
// (PyTorch's torch.nn.attention.flex_attention semantics), forward and backward, through
// the same backend selection as scaled_dot_product_attention.

#include <optional>
#include <vector>

#include "sdpa/flex.h"
#include "sdpa/sdpa.h"

namespace sdpa {

/// Returns out [B, Hq, L, Ev] and lse [B, Hq, L] of
///   softmax(mask(score_mod(q k^T * scale + additive biases))) v,
/// where an element is kept when its BlockMask block is full, or partial and mask_mod is
/// true (no block_mask: every element; empty blocks are never computed). `options`
/// supplies scale, enable_gqa, dropout and an attn_mask (tensor or AttnBias) that composes
/// with the program; is_causal adds the top-left causal band. Runs on FLASH (programs
/// evaluated over SIMD vectors of a tile row) or MATH (float64 reference evaluation); on
/// CUDA tensors first on CUDNN_ATTENTION where cuDNN can express the call (score_mods of
/// pointwise operations, BlockMasks whose mask_mod is a band: docs/cuda.md).
/// Throws sdpa::Error for invalid inputs, a BlockMask of other sizes, or a program
/// that reads a captured tensor out of range (naming the index and position).
AttentionResult flex_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const std::optional<flex::Program>& score_mod = std::nullopt,
                               const flex::BlockMask* block_mask = nullptr,
                               const SDPAOptions& options = {});

/// As above with a score_mod lambda (traced on each call; compiled forms are cached by
/// the program's structure).
AttentionResult flex_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const flex::ScoreMod& score_mod,
                               const flex::BlockMask* block_mask = nullptr,
                               const SDPAOptions& options = {});

/// The row maxima of the scores flex_attention softmaxes with the same arguments,
///   max_scores[b, h, i] = max_j mask(score_mod(q k^T * scale + additive biases))[i, j],
/// float32 [B, Hq, L] (natural units; -inf for a row with no kept element, NaN where a
/// kept score is NaN; dropout does not apply). torch 2.15 returns it with
/// `return_aux=AuxRequest(max_scores=True)`, e.g. to clip query/key weights whose logits
/// grow (MuonClip, Kimi K2 2025). A pass of its own over q k^T (MATH's scoring, float64
/// for float64 inputs), so it costs about half a MATH forward. CPU tensors only: throws
/// sdpa::Error for other devices, and as flex_attention for invalid inputs.
Tensor flex_attention_max_scores(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const std::optional<flex::Program>& score_mod = std::nullopt,
                                 const flex::BlockMask* block_mask = nullptr,
                                 const SDPAOptions& options = {});

/// Gradients of flex_attention: grad_q/k/v as scaled_dot_product_attention_backward, with
/// d(score_mod)/d(score) derived symbolically from the program, and in grad_captured (one
/// entry per score_mod captured tensor, in Program::captured() order; undefined unless the
/// tensor requires grad) d(loss)/d(tensor), accumulated deterministically. Throws
/// sdpa::Error when the score_mod's result does not depend differentiably on score (it
/// ignores score, or score only reaches it through comparisons).
AttentionGradients flex_attention_backward(const Tensor& grad_out, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& lse,
                                           const std::optional<flex::Program>& score_mod,
                                           const flex::BlockMask* block_mask = nullptr,
                                           const SDPAOptions& options = {});

}  // namespace sdpa
