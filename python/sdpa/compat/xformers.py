"""xFormers' ``memory_efficient_attention`` and its ``fmha.attn_bias`` masks on sdpa, in
xFormers' BMHK layout: replace ``import xformers.ops as xops`` with
``import sdpa.compat.xformers as xops``.

query [B, M, H, K], key [B, N, H, K], value [B, N, H, Kv]; or 5-D [B, M, G, H, K] with
key / value [B, N, G, 1 or H, K] (grouped-query attention, xFormers' BMGHK, kv heads
broadcast within a group). attn_bias: None, an additive float tensor broadcastable to
[B, H, M, N], or one of the mask classes here. ``p`` is the attention dropout. torch
tensors get autograd (through sdpa.torch). ``op`` is accepted and ignored (sdpa picks
its backend).
"""

from __future__ import annotations

import types
from typing import Any, Optional, Sequence

from .. import _C
from .._api import scaled_dot_product_attention
from ..attention import bias as _bias

__all__ = ["AttentionBias", "BlockDiagonalCausalFromBottomRightMask", "BlockDiagonalCausalMask",
           "BlockDiagonalMask", "LowerTriangularFromBottomRightMask", "LowerTriangularMask",
           "fmha", "memory_efficient_attention", "memory_efficient_attention_forward"]


class AttentionBias:
    """Base of the xFormers mask classes: each becomes an sdpa bias for the call's query
    and key lengths (lowered natively, never materialized)."""

    def _sdpa(self, q_len: int, kv_len: int) -> _bias.AttnBias:
        raise NotImplementedError

    def materialize(self, shape: Sequence[int], dtype: Any = "float32") -> Any:
        """The additive mask [..., M, N] (0 where kept, -inf elsewhere) as a numpy array (a
        torch tensor when ``dtype`` is a torch.dtype)."""
        *lead, M, N = (int(s) for s in shape)
        keep = self._sdpa(M, N).materialize((1, 1, M, N), "bool")
        if type(dtype).__module__.startswith("torch"):
            import torch

            keep = torch.as_tensor(keep).reshape(M, N)
            mask = torch.zeros((M, N), dtype=dtype).masked_fill(~keep, float("-inf"))
            return mask.expand(*lead, M, N)
        import numpy

        mask = numpy.where(numpy.asarray(keep).reshape(M, N), 0.0, -numpy.inf).astype(dtype)
        return numpy.broadcast_to(mask, (*lead, M, N))


class LowerTriangularMask(AttentionBias):
    """Causal, aligned top-left: query i sees keys j <= i."""

    def _sdpa(self, q_len: int, kv_len: int) -> _bias.AttnBias:
        return _bias.causal_upper_left(q_len, kv_len)


class LowerTriangularFromBottomRightMask(AttentionBias):
    """Causal, aligned bottom-right: query i sees keys j <= i + N - M."""

    def _sdpa(self, q_len: int, kv_len: int) -> _bias.AttnBias:
        return _bias.causal_lower_right(q_len, kv_len)


class BlockDiagonalMask(AttentionBias):
    """Packed sequences along M and N (batch 1): the queries of sequence d attend only to
    its keys. Build with ``from_seqlens``."""

    _causal = False
    _alignment = "top_left"

    def __init__(self, q_seqlen: Sequence[int], kv_seqlen: Optional[Sequence[int]] = None):
        self.q_seqlen = [int(n) for n in q_seqlen]
        self.kv_seqlen = self.q_seqlen if kv_seqlen is None else [int(n) for n in kv_seqlen]
        if len(self.kv_seqlen) != len(self.q_seqlen):
            raise _C.Error(f"kv_seqlen: expected {len(self.q_seqlen)} lengths (one per "
                           f"q_seqlen), got {len(self.kv_seqlen)}")

    @classmethod
    def from_seqlens(cls, q_seqlen: Sequence[int],
                     kv_seqlen: Optional[Sequence[int]] = None) -> "BlockDiagonalMask":
        """The mask of sequences of q_seqlen queries and kv_seqlen keys (default: the same)."""
        return cls(q_seqlen, kv_seqlen)

    def make_causal(self) -> "BlockDiagonalCausalMask":
        """Causal inside each sequence, aligned top-left."""
        return BlockDiagonalCausalMask(self.q_seqlen, self.kv_seqlen)

    def make_causal_from_bottomright(self) -> "BlockDiagonalCausalFromBottomRightMask":
        """Causal inside each sequence, aligned bottom-right."""
        return BlockDiagonalCausalFromBottomRightMask(self.q_seqlen, self.kv_seqlen)

    def _sdpa(self, q_len: int, kv_len: int) -> _bias.AttnBias:
        return _bias.BlockDiagonalBias.from_seqlens(self.q_seqlen, self.kv_seqlen, self._causal,
                                                    self._alignment)


class BlockDiagonalCausalMask(BlockDiagonalMask):
    """BlockDiagonalMask, causal inside each sequence (top-left)."""

    _causal = True


class BlockDiagonalCausalFromBottomRightMask(BlockDiagonalMask):
    """BlockDiagonalMask, causal inside each sequence (bottom-right)."""

    _causal = True
    _alignment = "bottom_right"


def _swap(x: Any, a: int, b: int) -> Any:
    return x.transpose(a, b) if hasattr(x, "permute") else x.swapaxes(a, b)


def _contiguous(x: Any) -> Any:
    if hasattr(x, "contiguous"):
        return x.contiguous()
    import numpy

    return numpy.ascontiguousarray(x)


def _merge_groups(query: Any, key: Any, value: Any) -> tuple:
    """BMGHK to BMHK: q heads (g, h) become g * H + h; kv heads broadcast within a group
    (stride 0, or one head) become the G kv heads of grouped-query attention."""
    B, M, G, H, K = query.shape
    q = query.reshape(B, M, G * H, K)

    def kv_heads(x):
        if x.shape[3] == 1 or _stride(x, 3) == 0:
            return x[:, :, :, 0]  # [B, N, G, K]: one kv head per group
        return x.reshape(x.shape[0], x.shape[1], G * H, x.shape[4])

    return q, kv_heads(key), kv_heads(value)


def _stride(x: Any, dim: int) -> int:
    return x.stride(dim) if hasattr(x, "permute") else x.strides[dim]


def memory_efficient_attention(query: Any, key: Any, value: Any, attn_bias: Any = None,
                               p: float = 0.0, scale: Optional[float] = None, *, op: Any = None,
                               output_dtype: Any = None) -> Any:
    """xformers.ops.memory_efficient_attention: out [B, M, H, Kv] (or [B, M, G, H, Kv]),
    softmax(query key^T * scale + attn_bias) value with dropout p; scale defaults to
    1/sqrt(K). Raises sdpa.Error for shapes that do not fit."""
    five_d = getattr(query, "ndim", 0) == 5
    if five_d:
        lead = query.shape[:4]
        query, key, value = _merge_groups(query, key, value)
    if getattr(query, "ndim", 0) != 4:
        raise _C.Error(f"query: expected [B, M, H, K] or [B, M, G, H, K], got shape "
                       f"{tuple(getattr(query, 'shape', ()))}")
    M, N = query.shape[1], key.shape[1]
    mask = attn_bias._sdpa(M, N) if isinstance(attn_bias, AttentionBias) else attn_bias
    out = scaled_dot_product_attention(
        _swap(query, 1, 2), _swap(key, 1, 2), _swap(value, 1, 2), attn_mask=mask, dropout_p=p,
        scale=scale, enable_gqa=key.shape[2] != query.shape[2])
    out = _contiguous(_swap(out, 1, 2))
    if five_d:
        out = out.reshape(*lead, out.shape[-1])
    if output_dtype is not None:
        out = out.to(output_dtype) if hasattr(out, "permute") else out.astype(output_dtype)
    return out


memory_efficient_attention_forward = memory_efficient_attention

#: ``xformers.ops.fmha``: the same function and the mask classes under ``attn_bias``.
fmha = types.SimpleNamespace(
    memory_efficient_attention=memory_efficient_attention,
    memory_efficient_attention_forward=memory_efficient_attention,
    attn_bias=types.SimpleNamespace(
        AttentionBias=AttentionBias, LowerTriangularMask=LowerTriangularMask,
        LowerTriangularFromBottomRightMask=LowerTriangularFromBottomRightMask,
        BlockDiagonalMask=BlockDiagonalMask, BlockDiagonalCausalMask=BlockDiagonalCausalMask,
        BlockDiagonalCausalFromBottomRightMask=BlockDiagonalCausalFromBottomRightMask))
