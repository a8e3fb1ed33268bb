#pragma once
// The per-sequence options of the serving entry points (attention_with_kvcache,
// attention_varlen), with flash-attn's meaning: every mask, bias and cap is measured in
// each sequence's own coordinates, bottom-right aligned.

#include <cstdint>
#include <optional>
#include <vector>

#include "sdpa/generator.h"

namespace sdpa {

/// Masks, ALiBi, soft-cap and scale of one attention over sequences of q_len queries and
/// kv_len keys each (lengths differ per sequence).
struct SequenceOptions {
  /// Bottom-right causal: query i sees keys j <= i + kv_len - q_len.
  bool causal = false;
  /// flash-attn's window_size: query i sees keys in [i + kv_len - q_len - left,
  /// i + kv_len - q_len + right]; -1 = unbounded on that side. (-1, -1): no window.
  int64_t window_left = -1, window_right = -1;
  /// ALiBi slopes, one per query head, aligned bottom-right as the window; empty: none.
  std::vector<float> alibi_slopes;
  /// Soft-capping of the scaled scores, cap * tanh(s / cap) (Gemma 2); 0: none. With ALiBi
  /// too, the ALiBi term is added to the capped score (flash-attn's order).
  double softcap = 0.0;
  /// Score scale; default 1/sqrt(E).
  std::optional<double> scale;
  /// Attention dropout (attention_varlen and its backward only; the serving paths of a KV
  /// cache are inference and refuse it): each weight is dropped with probability dropout_p
  /// and the kept ones scaled by 1 / (1 - dropout_p). Sequence b's weight (h, i, j) draws
  /// as weight (0, h, cu_seqlens_q[b] + i, cu_seqlens_k[b] + j) of the packed call
  /// [1, Hq, total_q, total_k], so the mask is the one scaled_dot_product_attention draws
  /// for the packed tensors under a BlockDiagonalBias with the same state (with softcap,
  /// flex_attention's with the cap).
  double dropout_p = 0.0;
  /// Draws the forward's state when dropout_state is absent; the default generator when
  /// null.
  Generator* generator = nullptr;
  /// The state to draw with: the backward passes the forward's AttentionResult::philox.
  std::optional<PhiloxState> dropout_state;
};

}  // namespace sdpa
