"""Context parallelism: one attention call over a sequence split across the ranks of a
torch.distributed process group (gloo on the CPU).

    import sdpa.distributed as cp
    q_local = cp.shard(q, "zigzag", world_size, rank)        # likewise k, v
    out_local = cp.context_parallel_attention(q_local, k_local, v_local,
                                              is_causal=True, layout="zigzag")
    out = cp.unshard(all_slices, "zigzag")                     # if the whole is wanted

Masks over global positions (causal, sliding windows, packed documents) become native
per-piece masks (pieces.py). Strategies (ring.py): ``"ring"`` passes K/V slices around
the ranks, overlapping each transfer with the attention to the previous slice, and
merges partial results by logsumexp; ``"all_gather"`` gathers K/V once and runs exact
local calls. Layouts (layout.py): ``"contiguous"`` slices or the causal load-balancing
``"zigzag"`` split.
"""

from __future__ import annotations

from typing import Any, Optional

from .. import _C, _convert
from .layout import LAYOUTS, Segment, segments, shard, unshard


def bytes_sent() -> int:
    """Bytes this process's context-parallel calls have sent to other ranks (ring
    exchanges; the all_gather strategy's collectives are not counted)."""
    from .ring import bytes_sent as sent

    return sent()


def reset_bytes_sent() -> None:
    """Sets bytes_sent() back to 0."""
    from .ring import reset_bytes_sent as reset

    reset()

STRATEGIES = ("ring", "all_gather")

__all__ = ["context_parallel_attention", "shard", "unshard", "segments", "Segment",
           "bytes_sent", "reset_bytes_sent", "LAYOUTS", "STRATEGIES"]


def context_parallel_attention(query: Any, key: Any, value: Any, group: Any = None, *,
                               strategy: str = "ring", layout: str = "contiguous",
                               is_causal: bool = False, scale: Optional[float] = None,
                               enable_gqa: bool = False, attn_mask: Any = None,
                               dropout_p: float = 0.0, generator: Any = None,
                               dropout_state: Optional[tuple] = None,
                               timeout: Optional[float] = None) -> Any:
    """Attention of this rank's queries to the keys/values of every rank of `group`
    (default: the world), as one scaled_dot_product_attention over the whole sequence.

    query [B, Hq, L_r, E], key [B, Hkv, L_r, E], value [B, Hkv, L_r, Ev]: this rank's
    slice of the sequence (the same positions for q, k and v; slices may differ in
    length and be empty), CPU torch tensors, float32 / float16 / bfloat16 (float64 with
    ``strategy="all_gather"``). ``layout`` says which global positions each rank holds
    (layout.py). Masks are over global positions: ``is_causal`` (query i sees keys j <=
    i) or ``attn_mask`` a LocalAttentionBias (sliding window), a BlockDiagonalBias whose
    documents cover the whole sequence (optionally causal), or a composition of the two
    (pieces.py); every rank passes the same one. GQA sends only the kv heads. Every rank
    of the group must call it with the same options. ``timeout`` (seconds) bounds each
    wait for a peer (default: the group's own timeout); a peer that dies or stalls makes
    the call raise sdpa.Error naming the exchange. Returns this rank's out [B, Hq, L_r,
    Ev] in the query's dtype; autograd flows to query, key and value (the ring backward
    passes dK / dV around the ring).

    Dropout drops exactly the weights one scaled_dot_product_attention over the whole
    sequence would with the same (seed, offset): ``dropout_state`` if given (every rank
    the same), else the next state of rank 0's ``generator`` (sdpa's default generator
    when None), broadcast to the group. Each piece draws at its global position
    (sdpa.DropoutPosition), so layouts and strategies give the same mask.

    Raises sdpa.Error for arguments it cannot serve: another attn_mask (tensors, ALiBi),
    CUDA tensors (the ring backward needs
    FLASH_ATTENTION, which sdpa runs on the CPU only), float64 with the ring strategy
    (FLASH's float64 backward recomputes row statistics instead of taking the global
    logsumexp); ValueError for an unknown strategy or layout, or slices that do not
    match the layout.
    """
    import torch
    import torch.distributed as dist

    from .ring import _ContextParallelAttention, _Ring

    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise _C.Error("context_parallel_attention: torch.distributed is not initialized "
                       "(call torch.distributed.init_process_group first)")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise _C.Error(f"context_parallel_attention: {name}: expected a 4-D torch tensor "
                           f"[B, H, L, E], got {getattr(t, 'shape', type(t).__name__)}")
        if t.device.type != "cpu":
            raise _C.Error(f"context_parallel_attention: {name}: expected a CPU tensor, got "
                           f"{t.device} (the ring backward runs on FLASH_ATTENTION, a CPU "
                           "backend)")
    dropout_p = _convert.number(dropout_p, "dropout_p")
    if not 0.0 <= dropout_p <= 1.0:
        raise _C.Error(f"context_parallel_attention: dropout_p: expected a probability in "
                       f"[0, 1], got {dropout_p}")
    if dropout_state is None and dropout_p > 0:
        generator = _convert.generator(generator) or _C.default_generator()
        dropout_state = generator.next_state() if dist.get_rank(group) == 0 else (0, 0)
    if strategy == "ring" and query.dtype == torch.float64:
        raise _C.Error("context_parallel_attention: float64 needs strategy='all_gather' (the "
                       "ring backward takes the global logsumexp, which FLASH's float64 "
                       "backward does not)")
    ring = _Ring(group, layout, query.shape[-2], key.shape[-2], attn_mask, bool(is_causal),
                 scale, bool(enable_gqa), strategy, timeout, dropout_p,
                 _convert.dropout_state(dropout_state))
    return _ContextParallelAttention.apply(query.contiguous(), key.contiguous(),
                                           value.contiguous(), ring)
