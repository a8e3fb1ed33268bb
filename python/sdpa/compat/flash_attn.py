"""flash-attn's functional API (``flash_attn_func``, ``flash_attn_varlen_func``,
``flash_attn_with_kvcache`` and the packed-QKV forms) on sdpa, with flash-attn's argument
names, BSHD layout and semantics: causal and window_size aligned bottom-right when the
query and key lengths differ, ALiBi as ``-slope * |i + S - L - j|``, soft-capping of the
scaled scores. Replace ``from flash_attn import flash_attn_func`` with
``from sdpa.compat.flash_attn import flash_attn_func``.

``dropout_p`` drops attention weights as flash-attn does, with sdpa's generator
(``sdpa.manual_seed``; the mask is sdpa's own, not flash-attn's CUDA one), and the torch
backward replays it (with ``softcap`` too).

Differences, each raising sdpa.Error rather than computing something else:
``return_attn_probs`` (flash-attn's S_dmask is a debugging output; the logsumexp is
returned as its second element), and ``flash_attn_with_kvcache``'s ``cache_batch_idx``
and ``cache_leftpad``.
``deterministic`` is accepted: every sdpa CPU path is deterministic.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .. import _C
from ..serving import attention_varlen, attention_with_kvcache

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_with_kvcache"]


def _refuse(value: Any, name: str, what: str) -> None:
    if value:
        raise _C.Error(f"{name}: sdpa.compat.flash_attn has no {what}; got {value!r}")


def _framework(x: Any):
    """numpy or torch, whichever module holds x's array type (for reshape / arange)."""
    if type(x).__module__.startswith("torch"):
        import torch

        return torch
    import numpy

    return numpy


def _offsets(like: Any, batch: int, length: int) -> Any:
    """int32 cu_seqlens [0, length, 2 length, ...] in x's framework."""
    xp = _framework(like)
    return xp.arange(0, (batch + 1) * length, length, dtype=xp.int32) if length else \
        xp.zeros(batch + 1, dtype=xp.int32)


def flash_attn_varlen_func(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: tuple = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Sequence[float]] = None,
                           deterministic: bool = False, return_attn_probs: bool = False,
                           block_table: Any = None) -> Any:
    """flash_attn_varlen_func: q [total_q, Hq, E], k/v [total_k, Hkv, E/Ev] (with
    block_table int32 [B, max_pages]: page pools [num_pages, page_size, Hkv, E/Ev]),
    cu_seqlens int32 [B + 1]. Returns out [total_q, Hq, Ev]; with return_attn_probs (out,
    softmax_lse [Hq, total_q], None). See sdpa.attention_varlen."""
    out, lse = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal=causal, window_size=window_size,
                                alibi_slopes=alibi_slopes, softcap=softcap,
                                scale=softmax_scale, return_lse=True, block_table=block_table,
                                dropout_p=dropout_p)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q: Any, k: Any, v: Any, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: tuple = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Sequence[float]] = None, deterministic: bool = False,
                    return_attn_probs: bool = False) -> Any:
    """flash_attn_func: q [B, Sq, Hq, E], k/v [B, Sk, Hkv, E/Ev] (Hq % Hkv == 0). Returns
    out [B, Sq, Hq, Ev]; with return_attn_probs (out, softmax_lse [B, Hq, Sq], None)."""
    if getattr(q, "ndim", 0) != 4 or getattr(k, "ndim", 0) != 4 or getattr(v, "ndim", 0) != 4:
        raise _C.Error("q, k, v: expected 4-D arrays [B, S, H, E], got shapes "
                       f"{tuple(getattr(q, 'shape', ()))}, {tuple(getattr(k, 'shape', ()))}, "
                       f"{tuple(getattr(v, 'shape', ()))}")
    B, Sq, Hq, _ = q.shape
    Sk = k.shape[1]
    packed = [x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]) for x in (q, k, v)]
    out, lse, _ = flash_attn_varlen_func(
        *packed, _offsets(q, B, Sq), _offsets(q, B, Sk), Sq, Sk, dropout_p, softmax_scale,
        causal, window_size, softcap, alibi_slopes, deterministic, True)
    out = out.reshape(B, Sq, Hq, out.shape[-1])
    if not return_attn_probs:
        return out
    lse = lse.reshape(Hq, B, Sq)  # varlen's [Hq, total_q] -> flash-attn's [B, Hq, Sq]
    lse = lse.permute(1, 0, 2) if hasattr(lse, "permute") else lse.transpose(1, 0, 2)
    return out, lse, None


def flash_attn_kvpacked_func(q: Any, kv: Any, dropout_p: float = 0.0,
                             softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size: tuple = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Sequence[float]] = None,
                             deterministic: bool = False, return_attn_probs: bool = False) -> Any:
    """flash_attn_kvpacked_func: kv [B, Sk, 2, Hkv, E]."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv: Any, dropout_p: float = 0.0,
                              softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size: tuple = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Sequence[float]] = None,
                              deterministic: bool = False, return_attn_probs: bool = False) -> Any:
    """flash_attn_qkvpacked_func: qkv [B, S, 3, H, E]."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


def flash_attn_with_kvcache(q: Any, k_cache: Any, v_cache: Any, k: Any = None, v: Any = None,
                            rotary_cos: Any = None, rotary_sin: Any = None,
                            cache_seqlens: Any = None, cache_batch_idx: Any = None,
                            cache_leftpad: Any = None, block_table: Any = None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: tuple = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True,
                            alibi_slopes: Optional[Sequence[float]] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False) -> Any:
    """flash_attn_with_kvcache: q [B, Sq, Hq, E], caches [B, S_max, Hkv, E/Ev], k/v new
    keys appended in place at cache_seqlens (int or int32 [B]; None: the whole cache is
    valid, and then nothing can be appended). rotary_interleaved defaults to True as in
    flash-attn. block_table int32 [B, max_pages]: the caches are page pools [num_pages,
    page_size, Hkv, E/Ev] (paged KV cache, read in place). num_splits is accepted (sdpa
    splits the keys itself). Returns out
    [B, Sq, Hq, Ev]; with return_softmax_lse (out, lse [B, Hq, Sq])."""
    _refuse(cache_batch_idx is not None, "cache_batch_idx", "cache batch index")
    _refuse(cache_leftpad is not None, "cache_leftpad", "left-padded cache")
    if cache_seqlens is None:
        if k is not None:
            raise _C.Error("cache_seqlens: expected the cache lengths when appending k/v "
                           "(None means the whole cache is valid)")
        cache_seqlens = int(k_cache.shape[1]) * (1 if block_table is None else
                                                 int(block_table.shape[1]))
    return attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, rotary_cos,
                                  rotary_sin, rotary_interleaved, causal, window_size,
                                  alibi_slopes, softcap, softmax_scale, return_softmax_lse,
                                  block_table)
