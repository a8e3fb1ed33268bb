"""Which parts of a rank's queries see which parts of a K/V slice, under a mask over global
positions, as pieces that each take one native sdpa call.

A mask over the whole sequence (self-attention, so L = S globally) is described by a
*band* — query i sees keys j with i - left <= j <= i + right, None unbounded (causal:
left None, right 0; LocalAttentionBias(left, right)) — and optional *documents* (packed
sequences, cu_seqlens: queries see only keys of their own document). A piece is a run
of local query rows against a run of local key rows of one document, whose band,
shifted to the piece's own first query and key, is a top-left LocalAttentionBias with
non-negative windows (or no mask at all when every key is visible to every row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from .. import _C
from ..attention.bias import BlockDiagonalBias, ComposedBias, LocalAttentionBias
from .layout import Segment

# Local query rows [q0, q1) against local key rows [k0, k1), under `mask` (None: all); the
# global positions of q0 and k0 last (for dropout's draws).
Piece = Tuple[int, int, int, int, Any, int, int]


@dataclass(frozen=True)
class GlobalMask:
    """A band and documents over global positions (module docstring)."""

    left: Optional[int] = None
    right: Optional[int] = None
    cu_seqlens: Optional[Tuple[int, ...]] = None


def global_mask(attn_mask: Any, is_causal: bool, total: int) -> GlobalMask:
    """The GlobalMask of context_parallel_attention's attn_mask / is_causal over `total`
    positions. Takes None, LocalAttentionBias (either alignment: L = S), BlockDiagonalBias
    (one cu_seqlens for q and kv, optionally causal) and a ComposedBias of those; raises
    sdpa.Error naming what it got otherwise."""
    if attn_mask is not None and is_causal:
        raise _C.Error("context_parallel_attention: pass attn_mask or is_causal, not both")
    band: List[Optional[int]] = [None, 0] if is_causal else [None, None]
    cu: Optional[Tuple[int, ...]] = None
    parts = attn_mask.parts if isinstance(attn_mask, ComposedBias) else (
        [] if attn_mask is None else [attn_mask])
    for part in parts:
        if isinstance(part, LocalAttentionBias):
            band = _intersect(band, [part.left, part.right])
        elif isinstance(part, BlockDiagonalBias):
            if part.cu_seqlens_kv and part.cu_seqlens_kv != part.cu_seqlens_q:
                raise _C.Error("context_parallel_attention: attn_mask: BlockDiagonalBias with "
                               "other key documents than query documents is not supported")
            if part.cu_seqlens_q[0] != 0 or part.cu_seqlens_q[-1] != total:
                raise _C.Error("context_parallel_attention: attn_mask: BlockDiagonalBias "
                               f"documents must cover the {total} positions of the whole "
                               f"sequence, got cu_seqlens {part.cu_seqlens_q}")
            if cu is not None and tuple(part.cu_seqlens_q) != cu:
                raise _C.Error("context_parallel_attention: attn_mask: two different "
                               "BlockDiagonalBias documents")
            cu = tuple(part.cu_seqlens_q)
            if part.causal:
                band = _intersect(band, [None, 0])
        else:
            raise _C.Error("context_parallel_attention: attn_mask: expected None, "
                           "LocalAttentionBias, BlockDiagonalBias or a composition of them "
                           f"(masks over global positions), got {type(part).__name__}")
    return GlobalMask(band[0], band[1], cu)


def _intersect(a: List[Optional[int]], b: List[Optional[int]]) -> List[Optional[int]]:
    def tighter(x, y):
        return y if x is None else x if y is None else min(x, y)

    return [tighter(a[0], b[0]), tighter(a[1], b[1])]


def _split(segs: Sequence[Segment], cu: Optional[Tuple[int, ...]]) -> List[Tuple[int, Segment]]:
    """Segments cut at document boundaries, each with its document index (0 without)."""
    if cu is None:
        return [(0, s) for s in segs]
    out = []
    for s in segs:
        pos = s.start
        while pos < s.start + s.length:
            doc = max(d for d in range(len(cu) - 1) if cu[d] <= pos)
            end = min(s.start + s.length, cu[doc + 1])
            out.append((doc, Segment(pos, end - pos, s.local + pos - s.start)))
            pos = end
    return out


def pieces(q_segs: Sequence[Segment], kv_segs: Sequence[Segment], mask: GlobalMask) -> List[Piece]:
    """The pieces of the queries of q_segs against the keys of kv_segs under `mask`."""
    out: List[Piece] = []
    left, right = mask.left, mask.right
    kv_split = _split(kv_segs, mask.cu_seqlens)
    for doc, qs in _split(q_segs, mask.cu_seqlens):
        for kv_doc, ks in kv_split:
            if kv_doc != doc:
                continue
            q_end, k_end = qs.start + qs.length, ks.start + ks.length
            # The first query whose band reaches the keys (right edge), then the first key
            # inside that query's band (left edge): both windows become non-negative. The
            # last rows and keys are cut where the band leaves them (no row without keys).
            q_first = qs.start if right is None else max(qs.start, ks.start - right)
            k_first = ks.start if left is None else max(ks.start, q_first - left)
            q_stop = q_end if left is None else min(q_end, k_end + left)
            k_stop = k_end if right is None else min(k_end, q_end + right)
            if q_first >= q_stop or k_first >= k_stop:
                continue
            all_seen = ((right is None or k_stop - 1 <= q_first + right) and
                        (left is None or k_first >= q_stop - 1 - left))
            piece_mask = None if all_seen else LocalAttentionBias(
                None if left is None else left - (q_first - k_first),
                None if right is None else q_first - k_first + right, "top_left")
            out.append((qs.local + q_first - qs.start, qs.local + q_stop - qs.start,
                        ks.local + k_first - ks.start, ks.local + k_stop - ks.start,
                        piece_mask, q_first, k_first))
    return out
