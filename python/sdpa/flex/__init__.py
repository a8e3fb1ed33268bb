"""Flex attention: FlexAttention-style ``score_mod`` / ``mask_mod`` functions traced into
sdpa's C++ expression programs and run by the fused CPU kernels, with their backward.

    slopes = torch.exp2(-torch.arange(1, 9.0))

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    block_mask = sdpa.create_block_mask(causal, None, None, L, S)
    out = sdpa.flex_attention(q, k, v, score_mod=alibi, block_mask=block_mask)

A mod is called once with proxy objects standing for score, b, h, q_idx and kv_idx, and
what it does to them is recorded: Python operators (arithmetic, ``//``, ``%``, ``**``,
comparisons, ``&`` ``|`` ``^`` ``~`` (logical on bools, bitwise on ints), ``<<`` ``>>``,
``abs``, ``math.floor`` / ``math.ceil``), torch functions and Tensor methods through
``__torch_function__`` (where, clamp, minimum, maximum, tanh, exp, exp2, log, sigmoid,
sqrt, sin, cos, floor, ceil, bitwise shifts, type conversions, new_ones..., see
``_methods.py``), numpy ufuncs and
np.where / np.clip, and reads of captured tensors indexed by traced integers
(``table[h, q_idx - kv_idx]``): torch tensors directly, numpy / jax arrays found in the
mod's closure or module globals automatically, other arrays wrapped with
:class:`capture`. Existing torch FlexAttention mods (and torch's and_masks, or_masks,
noop_mask) run unchanged. Anything else raises :class:`TraceError` (a TypeError) naming
the operation, e.g. Python control flow on a traced value (``if q_idx > 3:``) or
``torch.atan``. Semantics follow ``torch.nn.attention.flex_attention``.
"""

from ._attention import AuxOutput, AuxRequest, flex_attention, flex_attention_backward
from ._block_mask import BlockMask, and_masks, create_block_mask, noop_mask, or_masks
from ._proxy import TraceError
from ._trace import capture
from .mods import (alibi, causal_mask, document, prefix_lm, relative_position, sliding_window,
                   soft_cap)

__all__ = [
    "AuxOutput", "AuxRequest", "BlockMask", "TraceError", "alibi", "and_masks", "capture",
    "causal_mask",
    "create_block_mask", "document", "flex_attention", "flex_attention_backward",
    "noop_mask", "or_masks", "prefix_lm", "relative_position", "sliding_window", "soft_cap",
]
