"""Serving entry points: attention through a KV cache, packed variable-length attention,
and the merge of partial results.

``attention_with_kvcache`` has flash-attn's ``flash_attn_with_kvcache`` arguments and
semantics (BSHD layout, per-sequence ``cache_seqlens``, new keys appended in place, rotary
embedding, bottom-right causal and window masks); ``attention_varlen`` has
``flash_attn_varlen_func``'s (packed sequences delimited by ``cu_seqlens``, with autograd
for torch tensors); ``merge_attention_states`` combines
attention results over disjoint key sets by their logsumexp (split-KV, cascade attention,
shared prefixes). Arrays come from any framework with ``__dlpack__`` (numpy, torch, jax)
and results go back to the query's framework. CPU arrays.
"""

from typing import Any, Optional, Sequence

from . import _C, _convert

__all__ = ["append_paged_kv_cache", "attention_varlen", "attention_with_kvcache",
           "merge_attention_states"]


def _seqlens(cache_seqlens: Any, batch: int) -> Any:
    """An int becomes an int32 array of `batch` copies (flash-attn accepts both)."""
    if isinstance(cache_seqlens, int):
        import numpy

        return numpy.full((batch,), cache_seqlens, dtype=numpy.int32)
    return cache_seqlens


def attention_with_kvcache(q: Any, k_cache: Any, v_cache: Any, cache_seqlens: Any,
                           k_new: Any = None, v_new: Any = None, rotary_cos: Any = None,
                           rotary_sin: Any = None, rotary_interleaved: bool = False,
                           causal: bool = False, window_size: tuple = (-1, -1),
                           alibi_slopes: Optional[Sequence[float]] = None,
                           softcap: float = 0.0, scale: Optional[float] = None,
                           return_lse: bool = False, block_table: Any = None,
                           k_scale: Any = None, v_scale: Any = None) -> Any:
    """Attention of ``q`` against a KV cache, appending ``k_new``/``v_new`` in place first.

    q [B, L, Hq, E]; k_cache [B, S_max, Hkv, E] and v_cache [B, S_max, Hkv, Ev] of q's
    dtype (float32, bfloat16, float16; Hq % Hkv == 0); cache_seqlens: int32 [B] (or an
    int), each sequence's valid cache length. k_new/v_new [B, L_new, Hkv, E/Ev] are
    written at rows [cache_seqlens[b], cache_seqlens[b] + L_new) of the caches, which are
    modified in place (cache_seqlens is not: advance it yourself). rotary_cos/rotary_sin
    [max_positions, rotary_dim / 2] rotate k_new at cache_seqlens[b] + i and q likewise
    when causal or windowed (else q at cache_seqlens[b]); rotary_interleaved selects
    GPT-J's pairs over GPT-NeoX's halves. causal / window_size=(left, right) (-1:
    unbounded) are aligned bottom-right to each sequence's length after the append;
    alibi_slopes [Hq]; softcap: cap * tanh(score / cap) when > 0 (ALiBi is added after it).
    Returns out [B, L, Hq, Ev], and lse float32 [B, Hq, L] with ``return_lse``. Raises
    sdpa.Error naming the argument for bad input, before anything is written.

    Paged cache (vLLM / FlashInfer / flash-attn layout): with ``block_table`` int32
    [B, max_pages], k_cache / v_cache are page pools [num_pages, page_size, Hkv, E/Ev] and
    sequence b's position j is row j % page_size of page block_table[b][j // page_size];
    pages are read and written in place, and each sequence holds up to max_pages *
    page_size positions.

    Quantized cache (vLLM's ``kv_cache_dtype="fp8"``, llama.cpp's quantized KV): k_cache
    and v_cache of dtype float8_e4m3fn (torch.float8_e4m3fn), with ``k_scale`` /
    ``v_scale`` float32 scalars or [Hkv] (default 1): element x of kv head h reads as
    float(x) * scale[h], and k_new / v_new (q's dtype) are stored as x / scale[h] rounded
    to nearest even and saturated to +-448. The cache is read in place, half the bytes of
    a bfloat16 one.
    """
    batch = getattr(q, "shape", (0,))[0]
    out, lse, _ = _C.attention_with_kvcache(
        q, k_cache, v_cache, _seqlens(cache_seqlens, batch), k_new, v_new, rotary_cos,
        rotary_sin, bool(rotary_interleaved),
        *_sequence_args(causal, window_size, alibi_slopes, softcap, scale), block_table,
        k_scale, v_scale)
    out = _convert.like(out, q)
    return (out, _convert.like(lse, q)) if return_lse else out


def _sequence_args(causal: bool, window_size: tuple, alibi_slopes: Optional[Sequence[float]],
                   softcap: float, scale: Optional[float]) -> tuple:
    """The per-sequence options as _C's serving calls take them."""
    left, right = window_size
    return (bool(causal), int(left), int(right),
            [] if alibi_slopes is None else [float(s) for s in alibi_slopes],
            _convert.number(softcap, "softcap"),
            None if scale is None else _convert.number(scale, "scale"))


def attention_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                     max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     window_size: tuple = (-1, -1),
                     alibi_slopes: Optional[Sequence[float]] = None, softcap: float = 0.0,
                     scale: Optional[float] = None, return_lse: bool = False,
                     block_table: Any = None, dropout_p: float = 0.0) -> Any:
    """Attention of packed variable-length sequences (flash-attn's flash_attn_varlen_func).

    q [total_q, Hq, E], k [total_k, Hkv, E], v [total_k, Hkv, Ev] (float32, bfloat16,
    float16; Hq % Hkv == 0); cu_seqlens_q / cu_seqlens_k int32 [B + 1], from 0 to total_q /
    total_k: sequence b is queries [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and keys
    [cu_seqlens_k[b], cu_seqlens_k[b + 1]), and attends only to its own keys.
    max_seqlen_q / max_seqlen_k bound the lengths (a longer sequence is an error). causal /
    window_size=(left, right) (-1: unbounded) are aligned bottom-right in each sequence;
    alibi_slopes [Hq]; softcap: cap * tanh(score / cap) when > 0 (ALiBi is added after it).
    Returns out [total_q, Hq, Ev], and lse float32 [Hq, total_q] with ``return_lse``; a
    query that sees no key gives 0 (lse -inf). torch tensors get autograd through q, k and
    v (the library's per-sequence FlashAttention-2 backward). Raises sdpa.Error naming the
    argument for bad input.

    With ``block_table`` int32 [B, max_pages], k / v are page pools [num_pages, page_size,
    Hkv, E/Ev] read in place (chunked prefill over a paged KV cache, as flash-attn's
    block_table): sequence b's key j is row j % page_size of page block_table[b][j //
    page_size], and cu_seqlens_k counts each sequence's cached keys. Forward only, as in
    flash-attn: with torch tensors that require grad it raises sdpa.Error.

    ``dropout_p`` (training; not with ``block_table``): each attention
    weight is dropped with that probability and the rest scaled by 1 / (1 - dropout_p),
    the mask drawn from sdpa's default generator (``sdpa.manual_seed``) as the packed
    call's (sequence b's weight (h, i, j) is weight (h, cu_seqlens_q[b] + i,
    cu_seqlens_k[b] + j) of one [Hq, total_q, total_k] draw); the torch backward replays
    it.
    """
    options = _sequence_args(causal, window_size, alibi_slopes, softcap, scale)
    dropout_p = _convert.number(dropout_p, "dropout_p")
    lengths = (cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))
    if block_table is not None:
        if _convert.is_torch_tensor(q):
            import torch

            if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
                raise _C.Error("block_table: the paged varlen path has no backward (as "
                               "flash-attn's); call it under torch.no_grad()")
        out, lse, _, _ = _C.attention_varlen(q, k, v, *lengths, *options, block_table,
                                             dropout_p)
        out = _convert.like(out, q)
        return (out, _convert.like(lse, q)) if return_lse else out
    if _convert.is_torch_tensor(q):
        from .torch import _varlen_autograd

        out, lse = _varlen_autograd(q, k, v, lengths, options, dropout_p)
        return (out, lse) if return_lse else out
    out, lse, _, _ = _C.attention_varlen(q, k, v, *lengths, *options, None, dropout_p)
    out = _convert.like(out, q)
    return (out, _convert.like(lse, q)) if return_lse else out


def append_paged_kv_cache(k_new: Any, v_new: Any, k_cache: Any, v_cache: Any,
                          block_table: Any, positions: Any, k_scale: Any = None,
                          v_scale: Any = None) -> None:
    """Writes k_new [B, L_new, Hkv, E] / v_new [B, L_new, Hkv, Ev] into the page pools
    k_cache / v_cache [num_pages, page_size, Hkv, E/Ev] at positions [positions[b],
    positions[b] + L_new) of each sequence, through block_table int32 [B, max_pages]
    (FlashInfer's append_paged_kv_cache, one run of positions per sequence), in place.
    positions: int32 [B] (or an int for every sequence). float8_e4m3fn pools store
    x / scale[h] with ``k_scale`` / ``v_scale`` as in attention_with_kvcache. Raises
    sdpa.Error naming the argument before anything is written."""
    batch = getattr(k_new, "shape", (0,))[0]
    _C.append_paged_kv_cache(k_new, v_new, k_cache, v_cache, block_table,
                             _seqlens(positions, batch), k_scale,
                             v_scale)


def merge_attention_states(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple:
    """Merges attention over two disjoint key sets A and B of the same queries into the
    result over A and B together (FlashInfer's merge_state, with sdpa's layout and natural
    logarithm): lse = log(exp(lse_a) + exp(lse_b)) and out = exp(lse_a - lse) * out_a +
    exp(lse_b - lse) * out_b, the larger lse factored out. out_a/out_b [..., L, Ev] of one
    float dtype, lse_a/lse_b float32 [..., L] (what scaled_dot_product_attention_with_lse
    returns). Rows with lse -inf on both sides give out 0 and lse -inf. Returns (out, lse).
    """
    out, lse = _C.merge_attention_states(out_a, lse_a, out_b, lse_b)
    return _convert.like(out, out_a), _convert.like(lse, out_a)
