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

Continuous batching (``model.generate_batch``, ``init_continuous_batching``) accepts only
the implementations named "sdpa", "paged|eager" or containing "flash" (transformers
5.23), so ``register("sdpa")`` serves transformers' own "sdpa" name with this module: the
new keys are written into the paged cache as transformers' SDPA writes them, and each
packed batch runs as one ``sdpa.attention_varlen`` call over the pages in place (causal
bottom-right per request) instead of a gathered copy of every request's keys and a dense
[total_q, total_k] mask.
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

    cache = _paged_cache(kwargs)
    if cache is not None:
        runs_varlen = _packed_batch_runs_varlen(module, dropout, kwargs)
        paged = _store_in_pages(cache, module, query, key, value, kwargs) if runs_varlen else None
        if paged is not None:
            pooled_key, pooled_value, block_table = paged
            return _packed_batch(module, query, pooled_key, pooled_value, scaling, kwargs,
                                 block_table), None
        key, value = cache.update(key_states=key, value_states=value,
                                  layer_idx=module.layer_idx, kwargs=kwargs)
        if runs_varlen:
            return _packed_batch(module, query, key, value, scaling, kwargs), None
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


def _paged_cache(kwargs: dict) -> Any:
    """The call's continuous-batching PagedAttentionCache, or None."""
    cache = kwargs.get("cache")
    if cache is None:
        return None
    from transformers.generation.continuous_batching import PagedAttentionCache

    return cache if isinstance(cache, PagedAttentionCache) else None


def _packed_batch_runs_varlen(module: Any, dropout: float, kwargs: dict) -> bool:
    """Whether a continuous-batching call runs as one varlen call: the layer attends to
    all of each request's keys (no sliding window, whose cache keeps a window that only
    transformers' mask describes), without dropout or a learned position bias, and the
    packed request boundaries are given."""
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    return (window is None and not dropout
            and kwargs.get("position_bias") is None
            and not kwargs.get("output_attentions", False)
            and kwargs.get("cu_seq_lens_q") is not None
            and kwargs.get("cu_seq_lens_k") is not None)


def _store_in_pages(cache: Any, module: Any, query: Any, key: Any, value: Any,
                    kwargs: dict) -> Optional[tuple]:
    """Writes a step's new keys / values into the layer's pages (transformers' own write:
    index_copy_ at kwargs["write_index"]) and returns how to read them in place:
    (k_pages, v_pages, block_table) with the pools [num_pages, page_size, Hkv, E] and
    block_table int32 [B, max_pages], or (key, value, None) when no request has cached
    keys (the new keys are all there is). Instead of transformers' index_select, which
    copies every request's whole cache each layer and step, the pages are read where they
    lie. Selects kwargs' per-layer-type cu_seq_lens_k / max_length_k as cache.update does.
    Returns None (the caller uses cache.update) where the layer's allocator has no page
    view, the cache's dtype is not the query's, or autograd needs the gathered keys."""
    import torch

    allocator = cache.layer_to_allocator[module.layer_idx]
    if not getattr(allocator, "supports_block_table", False):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return None
    k_pages, v_pages = allocator.get_cache_for_block_table(module.layer_idx)
    if k_pages.dtype != key.dtype or v_pages.dtype != value.dtype:
        return None
    kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"][allocator.layer_type].to(torch.int32)
    kwargs["max_length_k"] = kwargs["max_length_k"][allocator.layer_type]
    write_index = kwargs["write_index"][allocator.index]
    for pages, new in ((k_pages, key), (v_pages, value)):
        pages.view(-1, *pages.shape[2:]).index_copy_(0, write_index, new[0].transpose(0, 1))
    read_index = kwargs["read_index"][allocator.index]
    if read_index.numel() == 0:
        return key, value, None
    # Request r's keys are read_index[cu_k[r]:cu_k[r + 1]], whole pages in order, each
    # starting at a page boundary: its first token's index names the page.
    page_size = k_pages.shape[1]
    cu_k = kwargs["cu_seq_lens_k"]
    pages_per_request = (cu_k[1:] - cu_k[:-1] + page_size - 1) // page_size
    page = torch.arange(max(int(pages_per_request.max()), 1), device=cu_k.device)
    first_token = (cu_k[:-1, None].long() + page * page_size).clamp(max=read_index.numel() - 1)
    block_table = torch.where(page < pages_per_request[:, None],
                              read_index[first_token] // page_size, 0)
    return k_pages, v_pages, block_table.to(torch.int32)


def _packed_batch(module: Any, query: Any, key: Any, value: Any, scaling: Optional[float],
                  kwargs: dict, block_table: Any = None) -> Any:
    """One continuous-batching step as sdpa.attention_varlen: query [1, Hq, Q, E] packs
    every request's new tokens (cu_seq_lens_q), key / value [1, Hkv, K, E] each request's
    cached + new keys (cu_seq_lens_k), or with ``block_table`` [B, max_pages] the page
    pools [num_pages, page_size, Hkv, E] holding them, read in place; request r's queries
    are the last of its keys, so causal is bottom-right per request. Rows past
    cu_seq_lens_q[-1] (padding) give 0. Returns out [1, Q, Hq, Ev]."""
    import torch

    from ..serving import attention_varlen

    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32)
    cu_k = kwargs["cu_seq_lens_k"].to(torch.int32)
    total_q, total_k = int(cu_q[-1]), int(cu_k[-1])
    max_q = kwargs.get("max_length_q") or int((cu_q[1:] - cu_q[:-1]).max())
    max_k = kwargs.get("max_length_k") or int((cu_k[1:] - cu_k[:-1]).max())
    if block_table is None:
        key, value = (x[0, :, :total_k].transpose(0, 1) for x in (key, value))
    softcap = kwargs.get("softcap")
    out = attention_varlen(
        query[0, :, :total_q].transpose(0, 1), key, value, cu_q, cu_k, int(max_q), int(max_k),
        causal=bool(getattr(module, "is_causal", True)),
        softcap=float(softcap) if softcap is not None else 0.0, scale=scaling,
        block_table=block_table)
    if total_q < query.shape[2]:
        out = torch.nn.functional.pad(out, (0, 0, 0, 0, 0, query.shape[2] - total_q))
    return out.unsqueeze(0)


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
    the name. ``register("sdpa")`` replaces transformers' own "sdpa" function for every
    model (continuous batching accepts no other name). Raises ImportError when
    transformers is not installed."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
