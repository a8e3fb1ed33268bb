#pragma once
// The per-sequence options of the serving entry points (attention_with_kvcache,
// attention_varlen), with flash-attn's meaning: every mask, bias and cap is measured in
// each sequence's own coordinates, bottom-right aligned.

#include <cstdint>
#include <optional>
#include <vector>

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
  /// Soft-capping of the scaled scores, cap * tanh(s / cap) (Gemma 2); 0: none.
  double softcap = 0.0;
  /// Score scale; default 1/sqrt(E).
  std::optional<double> scale;
};

}  // namespace sdpa
