"""Hugging Face transformers backend: ``attn_implementation="sdpa_cpp"``.

    import sdpa.integrations.transformers
    sdpa.integrations.transformers.register()
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa_cpp")

``register()`` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and
reuses transformers' own SDPA mask builder for that name (``AttentionMaskInterface``), so
every attention layer of a model gets exactly the masks, causal flag and GQA layout the
stock ``"sdpa"`` implementation gets, and runs through ``sdpa.torch`` (autograd and
``torch.compile`` included). transformers and torch are imported only by ``register()``.
"""

from __future__ import annotations

from typing import Any, Optional

NAME = "sdpa_cpp"

__all__ = ["NAME", "attention_forward", "register"]


def attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Optional[Any],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature, computed by ``sdpa``.

    query: [B, Hq, L, E], key / value: [B, Hkv, S, E / Ev] (Hq a multiple of Hkv: GQA
    runs natively, without repeating key/value), attention_mask: None, bool (True = take
    part) or additive float, broadcastable to [B, Hq, L, S], as transformers' SDPA mask
    builder makes them. ``is_causal`` defaults to ``module.is_causal`` and, as in
    transformers' ``sdpa`` implementation, applies only when there is no mask and more
    than one query row (top-left causal). Returns (out [B, L, Hq, Ev], None): attention
    weights are never materialized.

    Raises ValueError for ``softcap`` (use a flex score_mod instead) and for
    ``output_attentions=True``.
    """
    import torch

    from .. import torch as sdpa_torch

    if kwargs.get("softcap") is not None:
        raise ValueError("sdpa_cpp: softcap is not an SDPA option; use sdpa.flex_attention "
                         "with a soft-capping score_mod")
    if kwargs.get("output_attentions", False):
        raise ValueError("sdpa_cpp: output_attentions=True needs the attention weights, which "
                         "sdpa never materializes; use attn_implementation='eager'")
    position_bias = kwargs.get("position_bias")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q_len = query.shape[2]
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    if position_bias is not None:  # T5-style learned bias: one additive mask
        floor = torch.finfo(query.dtype).min
        if attention_mask is None:
            if is_causal:
                keep = torch.ones(q_len, key.shape[2], dtype=torch.bool, device=query.device).tril()
                position_bias = torch.where(keep, position_bias, floor)
            attention_mask = position_bias
        elif attention_mask.dtype == torch.bool:
            attention_mask = torch.where(attention_mask, position_bias, floor)
        else:
            attention_mask = position_bias + attention_mask
        is_causal = False
    out = sdpa_torch.scaled_dot_product_attention(
        query, key, value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        is_causal=is_causal,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Registers :func:`attention_forward` (and transformers' SDPA mask builder) under
    ``name`` so that ``from_pretrained(..., attn_implementation=name)`` uses sdpa. Returns
    the name. Raises ImportError when transformers is not installed."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
