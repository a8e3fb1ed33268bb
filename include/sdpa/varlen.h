#pragma once
// Packed variable-length attention in flash-attn's flash_attn_varlen_func shape: the
// sequences of a batch laid end to end in [total, H, E] tensors, delimited by cumulative
// lengths, each attending only within itself.

#include <cstdint>

#include "sdpa/sdpa.h"
#include "sdpa/sequence_options.h"

namespace sdpa {

/// Attention of packed sequences (flash-attn's flash_attn_varlen_func).
///   q [total_q, Hq, E], k [total_k, Hkv, E], v [total_k, Hkv, Ev]: float32, bfloat16 or
///   float16, one dtype, any strides; Hq % Hkv == 0 (GQA).
///   cu_seqlens_q / cu_seqlens_k: int32 [B + 1], starting at 0, non-decreasing, ending at
///   total_q / total_k: sequence b is queries [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and
///   keys [cu_seqlens_k[b], cu_seqlens_k[b + 1]).
///   max_seqlen_q / max_seqlen_k: bounds on the sequences' lengths (flash-attn sizes its
///   grid by them; here a length above its bound is an error, not a silent truncation).
/// Each sequence attends only to its own keys, with `options` measured in its own
/// q_len x kv_len (bottom-right causal and window, ALiBi, soft-cap, scale).
/// With options.dropout_p > 0 the weights are dropped as SequenceOptions::dropout_p
/// describes (the packed call's mask), with options.dropout_state or else one draw from
/// options.generator (the default generator when null).
/// Returns out [total_q, Hq, Ev] (q's dtype, contiguous) and lse float32 [Hq, total_q]
/// (flash-attn's softmax_lse layout for varlen), and the dropout state used in philox; a
/// query that sees no key (a sequence without keys, a window that excludes them all)
/// gives out 0 and lse -inf. Runs one
/// attention call per sequence on views of the packed tensors (no copies of q, k, v).
/// Throws sdpa::Error naming the argument for any shape, dtype, offset or length that
/// does not fit.
AttentionResult attention_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                 int64_t max_seqlen_q, int64_t max_seqlen_k,
                                 const SequenceOptions& options = {});

/// attention_varlen with keys and values in a paged KV cache (flash-attn's
/// flash_attn_varlen_func with block_table: chunked prefill over cached pages).
///   k_pages [num_pages, page_size, Hkv, E], v_pages [num_pages, page_size, Hkv, Ev]: the
///   page pools (q's dtype); block_table int32 [B, max_pages]: sequence b's key j is row
///   j % page_size of page block_table[b][j / page_size].
///   cu_seqlens_k: int32 [B + 1] cumulative key counts (sequence b has
///   cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys, the first ones of its pages).
/// Pages are read in place (no gather). Returns as attention_varlen. Throws sdpa::Error
/// naming the argument for any shape, dtype, offset, length or page index that does not
/// fit (a sequence needing more pages than its table row holds, a page outside the pool).
/// Forward only, as flash-attn's paged path (dropout_p must be 0).
AttentionResult attention_varlen_paged(const Tensor& q, const Tensor& k_pages,
                                       const Tensor& v_pages, const Tensor& cu_seqlens_q,
                                       const Tensor& cu_seqlens_k, const Tensor& block_table,
                                       int64_t max_seqlen_q, int64_t max_seqlen_k,
                                       const SequenceOptions& options = {});

/// Gradients of attention_varlen: grad_out [total_q, Hq, Ev], and out / lse as it
/// returned them for the same inputs and options. Returns grad_q [total_q, Hq, E],
/// grad_k [total_k, Hkv, E], grad_v [total_k, Hkv, Ev] (q's dtype; keys of a sequence
/// without queries get 0). Algorithm: FlashAttention-2's backward per sequence (soft-cap
/// through the flex backward's derivative of its score_mod). With dropout_p > 0,
/// options.dropout_state must be the forward's state (the mask is replayed). Throws
/// sdpa::Error as attention_varlen, and for grad_out / out / lse of other shapes.
AttentionGradients attention_varlen_backward(const Tensor& grad_out, const Tensor& q,
                                             const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& cu_seqlens_q,
                                             const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                             int64_t max_seqlen_k,
                                             const SequenceOptions& options = {});

}  // namespace sdpa
