"""Context-parallel attention on torch.distributed: ring and all-gather strategies.

Every rank holds a slice of the sequence (layout.py). The ring strategy (Ring Attention,
Liu et al. 2023; the blockwise merge of FlashAttention) passes the K/V slices around the
ranks: at step s rank r attends its queries to the slice of rank r - s, merging the
partial results by logsumexp (merge_attention_states), while the next slice is already
travelling (isend / irecv posted before the step's attention). The backward passes K, V
and their gradient accumulators around the ring once more, so that each slice's dK / dV
arrive back at its owner after visiting every rank; it takes the forward's merged out and
logsumexp, so each piece's probabilities are the global ones. The all-gather strategy
gathers K/V once and runs one exact call per query segment (Llama 3's context
parallelism); its backward sums dK / dV over the ranks.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .. import _C
from .._api import scaled_dot_product_attention_backward, scaled_dot_product_attention_with_lse
from .._kernel import current_restriction, restricted, sdpa_kernel
from ..serving import merge_attention_states
from .layout import Segment, segments
from .pieces import GlobalMask, global_mask, pieces

def accumulator_dtype(t: torch.Tensor) -> torch.dtype:
    """Gradients and partial outputs add up in float32, float64 inputs in float64."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


# Bytes this process has sent through exchange() (bytes_sent / reset_bytes_sent).
_sent = [0]


def bytes_sent() -> int:
    """Bytes this process's context-parallel calls have sent to their ring neighbours."""
    return _sent[0]


def reset_bytes_sent() -> None:
    _sent[0] = 0


class _Ring:
    """One call's group, segments and options (shared by forward and backward)."""

    def __init__(self, group: Any, layout: str, q_len: int, kv_len: int, mask: Any,
                 is_causal: bool, scale: Optional[float], enable_gqa: bool, strategy: str,
                 timeout: Optional[float], dropout_p: float = 0.0,
                 dropout_state: Tuple[int, int] = (0, 0)):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.timeout = None if timeout is None else timedelta(seconds=timeout)
        lengths = torch.tensor([q_len, kv_len], dtype=torch.int64)
        gathered = [torch.empty_like(lengths) for _ in range(self.world)]
        self.wait([(dist.all_gather(gathered, lengths, group=group, async_op=True), None)],
                  "the exchange of slice lengths")
        self.q_lengths = [int(g[0]) for g in gathered]
        self.kv_lengths = [int(g[1]) for g in gathered]
        if self.q_lengths != self.kv_lengths:
            raise _C.Error("context_parallel_attention: query and key/value slices must hold the "
                           f"same positions; q lengths per rank {self.q_lengths}, k/v "
                           f"{self.kv_lengths}")
        self.q_segs = segments(layout, self.q_lengths, self.rank)
        self.kv_segs = [segments(layout, self.kv_lengths, r) for r in range(self.world)]
        self.mask: GlobalMask = global_mask(mask, is_causal, sum(self.q_lengths))
        self.scale = scale
        self.enable_gqa = enable_gqa
        self.strategy = strategy
        self.dropout_p = dropout_p
        self.dropout_state = self.shared_dropout_state(dropout_state) if dropout_p > 0 else None

    def shared_dropout_state(self, state: Tuple[int, int]) -> Tuple[int, int]:
        """Rank 0's (seed, offset) on every rank."""
        seed, offset = state
        # Seeds use all 64 bits: sent as signed int64.
        both = torch.tensor([seed - (seed >> 63 << 64), offset], dtype=torch.int64)
        root = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        self.wait([(dist.broadcast(both, root, group=self.group, async_op=True), None)],
                  "the broadcast of the dropout state")
        return int(both[0]) % 2**64, int(both[1])

    def dropout(self, gq0: int, gk0: int) -> dict:
        """The dropout arguments of the piece whose first query and key are at global
        positions gq0, gk0: it draws the mask of the whole call (sdpa.DropoutPosition)."""
        if self.dropout_p == 0:
            return {}
        total = sum(self.q_lengths)
        return dict(dropout_p=self.dropout_p, dropout_state=self.dropout_state,
                    dropout_position=(gq0, gk0, total, total))

    def wait(self, works, what: str) -> None:
        """Waits for `works` (at most the call's timeout each); a failed or late peer
        becomes an sdpa.Error saying what was being exchanged, instead of a hang or a bare
        transport error."""
        for w, _ in works:
            try:
                if self.timeout is None:
                    w.wait()
                else:
                    w.wait(timeout=self.timeout)
            except RuntimeError as e:
                raise _C.Error(f"context_parallel_attention: rank {self.rank} of {self.world}: "
                               f"{what} failed (a peer died, left or is too slow): {e}") from e

    def peer(self, offset: int) -> int:
        group_rank = (self.rank + offset) % self.world
        if self.group is None or self.group is dist.group.WORLD:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def owner(self, step: int) -> int:
        """The rank whose K/V slice this rank holds at ring step `step`."""
        return (self.rank - step) % self.world

    def exchange(self, tensors: Sequence[torch.Tensor], recv_len: int) -> Tuple[list, list]:
        """Posts the send of `tensors` to the next rank and the receive of the previous
        rank's (same shapes but `recv_len` rows along dim -2); returns (works, buffers).
        Empty tensors travel as nothing: both sides know the lengths; a rank alone is its
        own neighbour. The works keep their P2POps (and so the tensors) alive."""
        if self.world == 1:
            return [], list(tensors)
        ops, buffers = [], []
        for t in tensors:
            shape = list(t.shape)
            shape[-2] = recv_len
            buf = torch.empty(shape, dtype=t.dtype, device=t.device)
            buffers.append(buf)
            if t.numel() > 0:
                ops.append(dist.P2POp(dist.isend, t.contiguous(), self.peer(1), self.group))
                _sent[0] += t.numel() * t.element_size()
            if buf.numel() > 0:
                ops.append(dist.P2POp(dist.irecv, buf, self.peer(-1), self.group))
        works = dist.batch_isend_irecv(ops) if ops else []
        return [(w, ops) for w in works], buffers

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, owner: int,
               out: torch.Tensor, lse: torch.Tensor, filled: List[Tuple[int, int]]) -> None:
        """Merges q's attention to the K/V slice of `owner` into out (float32) / lse.
        `filled`: the query row ranges that hold a result already; a piece over rows that
        hold none is stored as it is (what merging it with out = 0, lse = -inf gives, bit
        for bit: fully masked rows are 0 with lse -inf there too)."""
        for q0, q1, k0, k1, mask, gq0, gk0 in pieces(self.q_segs, self.kv_segs[owner],
                                                      self.mask):
            part = scaled_dot_product_attention_with_lse(
                q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :], attn_mask=mask,
                scale=self.scale, enable_gqa=self.enable_gqa, **self.dropout(gq0, gk0))
            if all(q1 <= a or b <= q0 for a, b in filled):
                out[..., q0:q1, :] = part.out
                lse[..., q0:q1] = part.lse
                filled.append((q0, q1))
                continue
            merged_out, merged_lse = merge_attention_states(
                out[..., q0:q1, :], lse[..., q0:q1], part.out.float(), part.lse)
            out[..., q0:q1, :] = merged_out
            lse[..., q0:q1] = merged_lse

    def grads(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, owner: int, dq: torch.Tensor,
              dk: torch.Tensor, dv: torch.Tensor) -> None:
        """Adds the gradients of q's attention to the K/V slice of `owner` (with the global
        out and lse) to dq and to that slice's dk / dv (float32)."""
        # FLASH computes each piece's probabilities from the given (global) logsumexp.
        with sdpa_kernel(_C.SDPBackend.FLASH_ATTENTION):
            for q0, q1, k0, k1, mask, gq0, gk0 in pieces(self.q_segs, self.kv_segs[owner],
                                                          self.mask):
                g = scaled_dot_product_attention_backward(
                    dout[..., q0:q1, :], q[..., q0:q1, :], k[..., k0:k1, :], v[..., k0:k1, :],
                    out[..., q0:q1, :], lse[..., q0:q1], attn_mask=mask, scale=self.scale,
                    enable_gqa=self.enable_gqa, **self.dropout(gq0, gk0))
                dq[..., q0:q1, :] += g.grad_q.float()
                dk[..., k0:k1, :] += g.grad_k.float()
                dv[..., k0:k1, :] += g.grad_v.float()

    def ring_forward(self, q, k, v):
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
        filled: List[Tuple[int, int]] = []
        for step in range(self.world):
            works, received = [], None
            if step + 1 < self.world:  # the next slice travels while this one is used
                works, received = self.exchange((k, v), self.kv_lengths[self.owner(step + 1)])
            self.attend(q, k, v, self.owner(step), out, lse, filled)
            self.wait(works, f"ring step {step} of the forward (the K/V slice of rank "
                             f"{self.owner(step + 1)})")
            if received is not None:
                k, v = received
        return out.to(q.dtype), lse

    def ring_backward(self, dout, q, k, v, out, lse):
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for step in range(self.world):
            self.grads(dout, q, k, v, out, lse, self.owner(step), dq, dk, dv)
            # The slice (and its gradients) moves on; after the last step only the
            # gradients travel, back to their owner.
            last = step + 1 == self.world
            travelling = (dk, dv) if last else (k, v, dk, dv)
            works, received = self.exchange(travelling, self.kv_lengths[self.owner(step + 1)])
            self.wait(works, f"ring step {step} of the backward (the K/V slice and gradients "
                             f"of rank {self.owner(step + 1)})")
            if last:
                dk, dv = received
            else:
                k, v, dk, dv = received
        return dq, dk, dv

    def gather_kv(self, k, v):
        """Every rank's K/V slice (rank order), through one all_gather of padded slices."""
        longest = max(self.kv_lengths)
        both = torch.cat([k, v], dim=-1)
        padded = torch.zeros(*both.shape[:-2], longest, both.shape[-1], dtype=both.dtype)
        padded[..., :both.shape[-2], :] = both
        gathered = [torch.empty_like(padded) for _ in range(self.world)]
        work = dist.all_gather(gathered, padded.contiguous(), group=self.group, async_op=True)
        self.wait([(work, None)], "the all_gather of K/V")
        e = k.shape[-1]
        return [(g[..., :n, :e], g[..., :n, e:]) for g, n in zip(gathered, self.kv_lengths)]

    def global_kv(self, slices):
        """K and V in global position order from every rank's slice."""
        parts = []
        for r, (k, v) in enumerate(slices):
            for s in self.kv_segs[r]:
                parts.append((s.start, k[..., s.local:s.local + s.length, :],
                              v[..., s.local:s.local + s.length, :]))
        parts.sort(key=lambda p: p[0])
        return torch.cat([p[1] for p in parts], dim=-2), torch.cat([p[2] for p in parts], dim=-2)

    def gathered_pieces(self, total: int):
        """The pieces of this rank's queries against the gathered K/V in global order: at
        most one per query row (documents split the query segments, never the rows)."""
        return pieces(self.q_segs, [Segment(0, total, 0)], self.mask)


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring):
        if ring.strategy == "ring":
            out, lse = ring.ring_forward(q, k, v)
            ctx.save_for_backward(q, k, v, out, lse)
        else:
            out = _all_gather_forward(ring, q, k, v)
            ctx.save_for_backward(q, k, v)
        ctx.ring = ring
        ctx.backends = current_restriction()
        return out

    @staticmethod
    def backward(ctx, dout):
        ring = ctx.ring
        dout = dout.contiguous()
        with restricted(ctx.backends):
            if ring.strategy == "ring":
                q, k, v, out, lse = ctx.saved_tensors
                dq, dk, dv = ring.ring_backward(dout, q, k, v, out, lse)
            else:
                q, k, v = ctx.saved_tensors
                dq, dk, dv = _all_gather_backward(ring, dout, q, k, v)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def _all_gather_forward(ring: _Ring, q, k, v):
    keys, values = ring.global_kv(ring.gather_kv(k, v))
    # Rows no key is visible to (none under the supported masks) stay 0.
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for q0, q1, k0, k1, mask, gq0, gk0 in ring.gathered_pieces(keys.shape[-2]):
        part = scaled_dot_product_attention_with_lse(
            q[..., q0:q1, :], keys[..., k0:k1, :], values[..., k0:k1, :], attn_mask=mask,
            scale=ring.scale, enable_gqa=ring.enable_gqa, **ring.dropout(gq0, gk0))
        out[..., q0:q1, :] = part.out
    return out


def _all_gather_backward(ring: _Ring, dout, q, k, v):
    slices = ring.gather_kv(k, v)
    keys, values = ring.global_kv(slices)
    total = keys.shape[-2]
    acc = accumulator_dtype(q)
    dq = torch.zeros(q.shape, dtype=acc)
    dkeys = torch.zeros(keys.shape, dtype=acc)
    dvalues = torch.zeros(values.shape, dtype=acc)
    for q0, q1, k0, k1, mask, gq0, gk0 in ring.gathered_pieces(total):
        kw = dict(attn_mask=mask, scale=ring.scale, enable_gqa=ring.enable_gqa,
                  **ring.dropout(gq0, gk0))
        q_rows, k_rows, v_rows = q[..., q0:q1, :], keys[..., k0:k1, :], values[..., k0:k1, :]
        part = scaled_dot_product_attention_with_lse(q_rows, k_rows, v_rows, **kw)
        g = scaled_dot_product_attention_backward(dout[..., q0:q1, :], q_rows, k_rows, v_rows,
                                                  part.out, part.lse, **kw)
        dq[..., q0:q1, :] += g.grad_q.to(acc)
        dkeys[..., k0:k1, :] += g.grad_k.to(acc)
        dvalues[..., k0:k1, :] += g.grad_v.to(acc)
    # Every rank's contributions to every position, summed; each keeps its own rows.
    both = torch.cat([dkeys, dvalues], dim=-1)
    ring.wait([(dist.all_reduce(both, group=ring.group, async_op=True), None)],
              "the all_reduce of dK/dV")
    e = k.shape[-1]
    dk = torch.empty(k.shape, dtype=acc)
    dv = torch.empty(v.shape, dtype=acc)
    for s in ring.kv_segs[ring.rank]:
        dk[..., s.local:s.local + s.length, :] = both[..., s.start:s.start + s.length, :e]
        dv[..., s.local:s.local + s.length, :] = both[..., s.start:s.start + s.length, e:]
    return dq, dk, dv
