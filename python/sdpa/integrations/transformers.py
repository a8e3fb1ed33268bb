"""Hugging Face transformers backend: ``attn_implementation="sdpa_cpp"``.

    import sdpa.integrations.transformers
    sdpa.integrations.transformers.register()
    model = AutoModel.from_pretrained(path, attn_implementation="sdpa_cpp")

``register()`` adds :func:`attention_forward` to transformers' ``AttentionInterface`` and
reuses transformers' own SDPA mask builder for that name (``AttentionMaskInterface``), so
every attention layer of a model gets exactly the masks, causal flag and GQA layout the
stock ``"sdpa"`` implementation gets, and runs through ``sdpa.torch`` (autograd and
``torch.compile`` included). transformers and torch are imported only by ``register()``.

transformers checks any implementation whose name contains "sdpa" against the model's
SDPA support; models it marks unsupported for SDPA because of soft-capping (Gemma 2) run
under another name: ``register("cpp_attention")``, then
``attn_implementation="cpp_attention"``.
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

    ``softcap`` (Gemma 2): ``softcap * tanh(score / softcap)`` on the scaled scores before
    the mask is added, as transformers' eager Gemma 2 attention; it runs as a flex
    score_mod (the mask read from the captured mask tensor, causal as a BlockMask).

    Raises ValueError for ``softcap`` with dropout and for ``output_attentions=True``.
    """
    import torch

    from .. import torch as sdpa_torch

    if kwargs.get("output_attentions", False):
        raise ValueError("sdpa_cpp: output_attentions=True needs the attention weights, which "
                         "sdpa never materializes; use attn_implementation='eager'")
    position_bias = kwargs.get("position_bias")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q_len = query.shape[2]
    is_causal = bool(q_len > 1 and attention_mask is None and is_causal)
    softcap = kwargs.get("softcap")
    if softcap is not None:
        if dropout:
            raise ValueError("sdpa_cpp: softcap runs as a flex score_mod, which has no "
                             "attention dropout; got dropout=" + str(dropout))
        out = _softcapped(query, key, value, attention_mask, scaling, is_causal, float(softcap))
        return out.transpose(1, 2).contiguous(), None
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


def _softcapped(query: Any, key: Any, value: Any, attention_mask: Optional[Any],
                scaling: Optional[float], is_causal: bool, softcap: float) -> Any:
    """Attention with soft-capped scores and then the mask added (Gemma 2's order), as a
    flex program: out [B, Hq, L, Ev]."""
    import torch

    from ..flex import create_block_mask, flex_attention
    from ..flex.mods import causal_mask

    mask = attention_mask
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=torch.float32).masked_fill(~mask, float("-inf"))
    elif mask is not None:
        mask = mask.detach().to(torch.float32)

    def score_mod(score, b, h, q_idx, kv_idx):
        capped = softcap * torch.tanh(score / softcap)
        if mask is None:
            return capped
        mb = b if mask.shape[0] > 1 else 0
        mh = h if mask.shape[1] > 1 else 0
        mq = q_idx if mask.shape[2] > 1 else 0
        return capped + mask[mb, mh, mq, kv_idx]

    block_mask = (create_block_mask(causal_mask, None, None, query.shape[2], key.shape[2])
                  if is_causal else None)
    return flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask,
                          scale=scaling, enable_gqa=query.shape[1] != key.shape[1])


def register(name: str = NAME) -> str:
    """Registers :func:`attention_forward` (and transformers' SDPA mask builder) under
    ``name`` so that ``from_pretrained(..., attn_implementation=name)`` uses sdpa. Returns
    the name. Raises ImportError when transformers is not installed."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
