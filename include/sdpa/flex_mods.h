#pragma once
// A small library of standard score_mods and mask_mods (the FlexAttention examples),
// each equal to its AttnBias / dense equivalent.

#include <cstdint>
#include <vector>

#include "sdpa/flex.h"

namespace sdpa::flex::mods {

/// q_idx >= kv_idx (top-left causal).
MaskMod causal();
/// Causal sliding window over the last `window` keys plus the current one:
/// kv_idx <= q_idx and q_idx - kv_idx <= window.
MaskMod sliding_window(int64_t window);
/// Prefix-LM: keys in the first `prefix_len` positions are visible to every query;
/// after that, causal.
MaskMod prefix_lm(int64_t prefix_len);
/// Packed documents: `document_id` (int32/int64 [L], with L == S) gives each position's
/// document; queries see only keys of their own document.
MaskMod document(const Tensor& document_id);
/// ALiBi as a score_mod: score - slopes[h] * |q_idx - kv_idx| (slopes float [H]).
ScoreMod alibi(const Tensor& slopes);
/// Learned relative position bias: score + table[h][q_idx - kv_idx + max_distance],
/// table float [H, 2 * max_distance + 1]; `requires_grad` makes the table trainable.
ScoreMod relative_position(const Tensor& table, int64_t max_distance,
                           bool requires_grad = false);
/// Tanh soft-capping (Gemma 2, Grok): cap * tanh(score / cap).
ScoreMod soft_cap(double cap);

}  // namespace sdpa::flex::mods
