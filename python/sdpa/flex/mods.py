"""Standard score_mods and mask_mods (FlexAttention's examples), mirroring the C++
``sdpa::flex::mods`` (include/sdpa/flex_mods.h). Tables may be torch tensors (autograd
reaches them) or any other array (captured)."""

from __future__ import annotations

from typing import Any, Callable

from .. import _convert
from ._trace import capture

__all__ = ["alibi", "causal_mask", "document", "prefix_lm", "relative_position",
           "sliding_window", "soft_cap"]


def _table(array: Any, name: str, requires_grad: bool = False) -> Any:
    return array if _convert.is_torch_tensor(array) else capture(array, name, requires_grad)


def causal_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    """mask_mod: q_idx >= kv_idx (top-left causal)."""
    return q_idx >= kv_idx


def sliding_window(window: int) -> Callable:
    """mask_mod: causal window over the last ``window`` keys and the current one,
    kv_idx <= q_idx <= kv_idx + window. Raises ValueError for window < 0."""
    if window < 0:
        raise ValueError(f"sliding_window: expected window >= 0, got {window}")
    return lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx <= window)


def prefix_lm(prefix_len: int) -> Callable:
    """mask_mod: keys before ``prefix_len`` visible to every query, causal after. Raises
    ValueError for prefix_len < 0."""
    if prefix_len < 0:
        raise ValueError(f"prefix_lm: expected prefix_len >= 0, got {prefix_len}")
    return lambda b, h, q_idx, kv_idx: (kv_idx < prefix_len) | (q_idx >= kv_idx)


def document(document_id: Any) -> Callable:
    """mask_mod for packed documents: ``document_id`` (int array [L], L == S) gives each
    position's document; queries see the keys of their own document. Reading past the
    array raises sdpa.Error when the mask is built."""
    ids = _table(document_id, "document_id")
    return lambda b, h, q_idx, kv_idx: ids[q_idx] == ids[kv_idx]


def alibi(slopes: Any) -> Callable:
    """score_mod: ALiBi, score - slopes[h] * |q_idx - kv_idx| (slopes float [H])."""
    s = _table(slopes, "slopes")
    return lambda score, b, h, q_idx, kv_idx: score - s[h] * abs(q_idx - kv_idx)


def relative_position(table: Any, max_distance: int, requires_grad: bool = False) -> Callable:
    """score_mod: learned relative position bias, score + table[h, q_idx - kv_idx +
    max_distance] (table float [H, 2 max_distance + 1]; |q_idx - kv_idx| beyond
    max_distance reads out of range: sdpa.Error). A torch table that requires grad gets
    its gradient through autograd; for other arrays ``requires_grad`` makes
    flex_attention_backward return it."""
    t = _table(table, "rel_bias", requires_grad)
    return lambda score, b, h, q_idx, kv_idx: score + t[h, q_idx - kv_idx + max_distance]


def soft_cap(cap: float) -> Callable:
    """score_mod: tanh soft-capping (Gemma 2, Grok), cap * tanh(score / cap). Raises
    ValueError for cap <= 0."""
    if not cap > 0:
        raise ValueError(f"soft_cap: expected cap > 0, got {cap}")
    return lambda score, b, h, q_idx, kv_idx: cap * (score / cap).tanh()
