"""Which positions of the global sequence each rank of a context-parallel group holds.

A rank's local slice of q / k / v is the concatenation of its *segments*, runs of
consecutive global positions. Two layouts:

- ``"contiguous"``: rank r holds one run, after the runs of ranks 0 .. r-1 (slices may
  differ in length, and may be empty).
- ``"zigzag"``: the sequence is cut into 2N chunks (N ranks, ``torch.tensor_split``
  sizes) and rank r holds chunks r and 2N-1-r. Under a causal mask every rank then has
  the same amount of work (ring-flash-attention's and Megatron's causal load balancing),
  where contiguous slices leave rank 0 almost idle and the last rank with most of it.

``shard`` and ``unshard`` cut a global tensor into a rank's slice and put the slices of
every rank back together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Sequence

LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class Segment:
    """Global positions [start, start + length) held at local rows [local, local + length)."""

    start: int
    length: int
    local: int


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def _chunk_bounds(total: int, chunks: int) -> List[int]:
    """Boundaries of torch.tensor_split(range(total), chunks): the first total % chunks
    chunks one longer."""
    base, extra = divmod(total, chunks)
    bounds = [0]
    for c in range(chunks):
        bounds.append(bounds[-1] + base + (1 if c < extra else 0))
    return bounds


def segments(layout: str, lengths: Sequence[int], rank: int) -> List[Segment]:
    """The segments of `rank` given every rank's local length (`lengths`, rank order).

    contiguous: one segment after the lengths of the ranks before. zigzag: the lengths must
    be what ``shard(x, "zigzag", world, r)`` gives for some global length (checked: a
    ValueError names the expected lengths otherwise).
    """
    _check_layout(layout)
    world = len(lengths)
    if not 0 <= rank < world:
        raise ValueError(f"rank: expected 0 <= rank < {world}, got {rank}")
    if layout == "contiguous":
        start = sum(lengths[:rank])
        return [Segment(start, lengths[rank], 0)] if lengths[rank] > 0 else []
    total = sum(lengths)
    bounds = _chunk_bounds(total, 2 * world)
    expected = [bounds[r + 1] - bounds[r] + bounds[2 * world - r] - bounds[2 * world - r - 1]
                for r in range(world)]
    if list(lengths) != expected:
        raise ValueError(f"zigzag layout: local lengths {list(lengths)} are not the zigzag split "
                         f"of {total} positions over {world} ranks ({expected})")
    out: List[Segment] = []
    local = 0
    for chunk in (rank, 2 * world - 1 - rank):
        length = bounds[chunk + 1] - bounds[chunk]
        if length > 0:
            out.append(Segment(bounds[chunk], length, local))
            local += length
    return out


def shard(x: Any, layout: str, world_size: int, rank: int, dim: int = -2) -> Any:
    """Rank `rank`'s slice of the global tensor `x` along `dim` (the sequence dimension:
    -2 for [B, H, L, E]). contiguous: ``torch.tensor_split`` into world_size pieces."""
    _check_layout(layout)
    import torch

    if layout == "contiguous":
        return torch.tensor_split(x, world_size, dim=dim)[rank]
    chunks = torch.tensor_split(x, 2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def unshard(slices: Sequence[Any], layout: str, dim: int = -2) -> Any:
    """The global tensor from every rank's slice (rank order): the inverse of shard."""
    _check_layout(layout)
    import torch

    if layout == "contiguous":
        return torch.cat(list(slices), dim=dim)
    world = len(slices)
    total = sum(s.shape[dim] for s in slices)
    bounds = _chunk_bounds(total, 2 * world)
    pieces: List[Any] = [None] * (2 * world)
    for r, s in enumerate(slices):
        first = bounds[r + 1] - bounds[r]
        pieces[r] = s.narrow(dim, 0, first)
        pieces[2 * world - 1 - r] = s.narrow(dim, first, s.shape[dim] - first)
    return torch.cat(pieces, dim=dim)
