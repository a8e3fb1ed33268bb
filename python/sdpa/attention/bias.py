"""Attention biases that the fused kernels run natively, without a dense [L, S] tensor.

PyTorch's ``torch.nn.attention.bias`` names (``CausalBias``, ``CausalVariant``,
``causal_upper_left``, ``causal_lower_right``) plus sliding windows, ALiBi, packed
documents, padded keys and compositions of them. Pass any of them as ``attn_mask``::

    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, S))

Your own bias: subclass :class:`AttnBias` and implement ``materialize(shape, dtype)``,
returning an array (numpy, torch, ...) broadcastable to ``shape`` = (B, Hq, L, S): bool
(True = the key takes part) or additive float of ``dtype`` (a str such as "float32"; -inf
masks). It then runs on every backend through the dense path::

    class Banded(AttnBias):
        def materialize(self, shape, dtype):
            i = np.arange(shape[2])[:, None]; j = np.arange(shape[3])[None, :]
            return abs(i - j) <= 2
"""

from __future__ import annotations

import functools
import json
from typing import Any, Iterable, Optional, Sequence, Union

from .. import _C, _convert

__all__ = [
    "AttnBias",
    "CausalVariant",
    "CausalBias",
    "causal_upper_left",
    "causal_lower_right",
    "DiagonalAlignment",
    "LocalAttentionBias",
    "AlibiBias",
    "alibi_slopes",
    "BlockDiagonalBias",
    "PaddedKeysBias",
    "ComposedBias",
    "TensorBias",
    "compose",
]

CausalVariant = _C.CausalVariant
DiagonalAlignment = _C.DiagonalAlignment


def _shape4(shape: Sequence[int]) -> tuple[int, int, int, int]:
    shape = tuple(int(s) for s in shape)
    if not 2 <= len(shape) <= 4:
        raise ValueError(f"shape: expected (B, Hq, L, S), (Hq, L, S) or (L, S), got {shape}")
    return (1,) * (4 - len(shape)) + shape


def _alignment(value: Any) -> "_C.DiagonalAlignment":
    """DiagonalAlignment from the enum, a CausalVariant (UPPER_LEFT = top-left) or a str
    ("top_left", "bottom_right", "upper_left", "lower_right")."""
    if isinstance(value, _C.DiagonalAlignment):
        return value
    if isinstance(value, str):
        key = value.lower().replace("-", "_")
    else:  # CausalVariant: ours or torch's
        key = getattr(value, "name", str(value)).lower()
    if key in ("top_left", "upper_left"):
        return _C.DiagonalAlignment.TOP_LEFT
    if key in ("bottom_right", "lower_right"):
        return _C.DiagonalAlignment.BOTTOM_RIGHT
    raise ValueError(f"alignment: expected 'top_left' or 'bottom_right', got {value!r}")


class AttnBias:
    """Base of every attention bias. Subclasses written in Python implement
    ``materialize(shape, dtype)`` (and optionally ``describe()``)."""

    #: JSON description that rebuilds a built-in bias inside the torch custom op (None when
    #: the bias cannot be described, e.g. a user subclass: it is then materialized).
    _spec: Optional[str] = None

    def materialize(self, shape: Sequence[int], dtype: Any = "float32") -> Any:
        """Returns the dense equivalent, broadcastable to shape = (B, Hq, L, S): bool
        (True = take part) or additive float of ``dtype``."""
        raise NotImplementedError(
            f"{type(self).__qualname__}: an AttnBias subclass must implement "
            "materialize(shape, dtype)")

    def describe(self) -> str:
        """One line for sdpa.explain()."""
        return type(self).__qualname__

    def _to_cpp(self) -> "_C.AttnBias":
        """The C++ bias; a Python subclass is called back for materialize()."""
        return _C.python_bias(self)

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__}: {self.describe()}>"


class _NativeBias(AttnBias):
    """A bias implemented in C++ (lowered to the kernels' native mask descriptor)."""

    def __init__(self, cpp: "_C.AttnBias", spec: Optional[dict]):
        self._cpp = cpp
        self._spec = json.dumps(spec, sort_keys=True) if spec is not None else None

    def _to_cpp(self) -> "_C.AttnBias":
        return self._cpp

    def materialize(self, shape: Sequence[int], dtype: Any = "float32") -> Any:
        """Dense equivalent as a numpy array (a torch tensor when ``dtype`` is a
        torch.dtype or bfloat16)."""
        name, want_torch = _convert.dtype_name(dtype)
        return _convert.from_sdpa(self._cpp.materialize(_shape4(shape), name), want_torch)

    def describe(self) -> str:
        return self._cpp.describe()


class CausalBias(_NativeBias):
    """Causal mask for seq_len_q x seq_len_kv scores (torch.nn.attention.bias.CausalBias).
    UPPER_LEFT: query i sees keys j <= i. LOWER_RIGHT: the diagonal ends at the
    bottom-right corner (query i sees j <= i + S - L)."""

    def __init__(self, variant: Any, seq_len_q: int, seq_len_kv: int):
        self.variant = _C.CausalVariant(int(getattr(variant, "value", variant)))
        self.seq_len_q = int(seq_len_q)
        self.seq_len_kv = int(seq_len_kv)
        super().__init__(
            _C.causal_bias(self.variant, self.seq_len_q, self.seq_len_kv),
            {"type": "causal", "variant": int(self.variant.value), "q_len": self.seq_len_q,
             "kv_len": self.seq_len_kv})


def causal_upper_left(*size: int) -> CausalBias:
    """CausalBias(UPPER_LEFT, seq_len_q, seq_len_kv), as PyTorch's."""
    if len(size) != 2:
        raise ValueError(f"causal_upper_left: expected (seq_len_q, seq_len_kv), got {size}")
    return CausalBias(CausalVariant.UPPER_LEFT, *size)


def causal_lower_right(*size: int) -> CausalBias:
    """CausalBias(LOWER_RIGHT, seq_len_q, seq_len_kv), as PyTorch's."""
    if len(size) != 2:
        raise ValueError(f"causal_lower_right: expected (seq_len_q, seq_len_kv), got {size}")
    return CausalBias(CausalVariant.LOWER_RIGHT, *size)


class LocalAttentionBias(_NativeBias):
    """Sliding window (FlashAttention's window_size): query i sees keys j with
    i + d - left <= j <= i + d + right, d = S - L (bottom-right) or 0 (top-left); None is
    unbounded. left=W, right=0 is causal attention over the last W + 1 keys."""

    def __init__(self, left: Optional[int] = None, right: Optional[int] = None,
                 alignment: Any = "bottom_right"):
        self.left = None if left is None else int(left)
        self.right = None if right is None else int(right)
        self.alignment = _alignment(alignment)
        super().__init__(
            _C.local_attention_bias(self.left, self.right, self.alignment),
            {"type": "local", "left": self.left, "right": self.right,
             "alignment": self.alignment.name})


def alibi_slopes(num_heads: int) -> list[float]:
    """The standard ALiBi slopes for ``num_heads`` heads (Press et al., 2022)."""
    return list(_C.alibi_slopes(int(num_heads)))


class AlibiBias(_NativeBias):
    """ALiBi: adds -slope[h] * |i + d - j| to the scores (d as in LocalAttentionBias).
    ``AlibiBias(num_heads)`` uses the paper's slopes; ``AlibiBias(slopes=[...])`` or
    ``AlibiBias([...])`` gives one slope per query head."""

    def __init__(self, num_heads: Union[int, Iterable[float], None] = None, *,
                 slopes: Optional[Iterable[float]] = None, alignment: Any = "bottom_right"):
        if slopes is None and num_heads is not None and not isinstance(num_heads, int):
            num_heads, slopes = None, num_heads
        if (num_heads is None) == (slopes is None):
            raise ValueError("AlibiBias: expected either num_heads or slopes")
        self.alignment = _alignment(alignment)
        if slopes is not None:
            cpp = _C.alibi_bias_slopes([float(s) for s in _as_list(slopes)], self.alignment)
        else:
            cpp = _C.alibi_bias_heads(int(num_heads), self.alignment)
        self.slopes = list(_C.alibi_bias_slopes_of(cpp))
        super().__init__(cpp, {"type": "alibi", "slopes": self.slopes,
                               "alignment": self.alignment.name})


class BlockDiagonalBias(_NativeBias):
    """Packed variable-length documents (xFormers' BlockDiagonalMask): queries
    [cu_seqlens_q[d], cu_seqlens_q[d+1]) attend only to keys [cu_seqlens_kv[d],
    cu_seqlens_kv[d+1]); with ``causal``, causal inside each document."""

    def __init__(self, cu_seqlens_q: Iterable[int], cu_seqlens_kv: Optional[Iterable[int]] = None,
                 causal: bool = False, alignment: Any = "top_left"):
        self.cu_seqlens_q = [int(x) for x in _as_list(cu_seqlens_q)]
        self.cu_seqlens_kv = ([] if cu_seqlens_kv is None
                              else [int(x) for x in _as_list(cu_seqlens_kv)])
        self.causal = bool(causal)
        self.alignment = _alignment(alignment)
        super().__init__(
            _C.block_diagonal_bias(self.cu_seqlens_q, self.cu_seqlens_kv, self.causal,
                                   self.alignment),
            {"type": "block_diagonal", "cu_seqlens_q": self.cu_seqlens_q,
             "cu_seqlens_kv": self.cu_seqlens_kv, "causal": self.causal,
             "alignment": self.alignment.name})

    @classmethod
    def from_seqlens(cls, q_seqlens: Iterable[int], kv_seqlens: Optional[Iterable[int]] = None,
                     causal: bool = False, alignment: Any = "top_left") -> "BlockDiagonalBias":
        """From per-document lengths instead of cumulative offsets."""

        def cumulative(lengths):
            out = [0]
            for n in _as_list(lengths):
                out.append(out[-1] + int(n))
            return out

        return cls(cumulative(q_seqlens), None if kv_seqlens is None else cumulative(kv_seqlens),
                   causal, alignment)


class PaddedKeysBias(_NativeBias):
    """Right-padded keys: batch b has kv_lengths[b] valid keys. With ``causal``, query i
    sees keys j <= i + kv_lengths[b] - L (decoding against a padded KV cache)."""

    def __init__(self, kv_lengths: Iterable[int], causal: bool = False):
        self.kv_lengths = [int(x) for x in _as_list(kv_lengths)]
        self.causal = bool(causal)
        super().__init__(_C.padded_keys_bias(self.kv_lengths, self.causal),
                         {"type": "padded_keys", "kv_lengths": self.kv_lengths,
                          "causal": self.causal})


class TensorBias(_NativeBias):
    """A dense mask array (bool, or additive float of the query dtype) as an AttnBias,
    for composing with other biases."""

    def __init__(self, mask: Any):
        self.mask = mask
        super().__init__(_C.tensor_bias(mask), None)


class ComposedBias(_NativeBias):
    """Several biases at once: masks intersect, additive terms add. Lowered natively when
    every part can be; a Python part makes the whole composition materialize."""

    def __init__(self, parts: Iterable[Any]):
        self.parts = [p if isinstance(p, AttnBias) else _as_bias(p) for p in parts]
        specs = [p._spec for p in self.parts]
        spec = None
        if specs and all(s is not None for s in specs):
            spec = {"type": "compose", "parts": [json.loads(s) for s in specs]}
        super().__init__(_C.compose([p._to_cpp() for p in self.parts]), spec)


def compose(*parts: Any) -> ComposedBias:
    """ComposedBias of the given biases (or one iterable of them); arrays become
    TensorBias."""
    if len(parts) == 1 and isinstance(parts[0], (list, tuple)):
        parts = tuple(parts[0])
    return ComposedBias(parts)


def _as_list(values: Any) -> list:
    tolist = getattr(values, "tolist", None)  # numpy arrays, torch tensors
    return list(tolist()) if tolist is not None else list(values)


def _as_bias(obj: Any) -> AttnBias:
    torch_bias = _from_torch_bias(obj)
    if torch_bias is not None:
        return torch_bias
    if isinstance(obj, _C.AttnBias):
        return _NativeBias(obj, None)
    return TensorBias(obj)


def _from_torch_bias(obj: Any) -> Optional[CausalBias]:
    """Our CausalBias for torch.nn.attention.bias.CausalBias, else None."""
    t = type(obj)
    if t.__name__ == "CausalBias" and t.__module__.startswith("torch."):
        return CausalBias(obj.variant.value, obj.seq_len_q, obj.seq_len_kv)
    return None


def to_cpp_mask(attn_mask: Any) -> Any:
    """The attn_mask argument for sdpa._C: None, a C++ bias, or the array itself."""
    if attn_mask is None or isinstance(attn_mask, _C.AttnBias):
        return attn_mask
    if isinstance(attn_mask, AttnBias):
        return attn_mask._to_cpp()
    torch_bias = _from_torch_bias(attn_mask)
    if torch_bias is not None:
        return torch_bias._to_cpp()
    if getattr(type(attn_mask), "__dlpack__", None) is None and hasattr(attn_mask, "materialize"):
        return _C.python_bias(attn_mask)  # duck-typed bias
    return attn_mask


def spec_of(attn_mask: Any) -> Optional[str]:
    """JSON spec of a built-in bias (or torch's CausalBias), None otherwise. Plain Python
    (no C++ call), so torch.compile traces it."""
    if isinstance(attn_mask, AttnBias):
        return attn_mask._spec
    t = type(attn_mask)
    if t.__name__ == "CausalBias" and t.__module__.startswith("torch."):
        # json.dumps(..., sort_keys=True) of CausalBias's spec, spelled out for the tracer.
        return (f'{{"kv_len": {int(attn_mask.seq_len_kv)}, "q_len": {int(attn_mask.seq_len_q)}, '
                f'"type": "causal", "variant": {int(attn_mask.variant.value)}}}')
    return None


@functools.lru_cache(maxsize=256)
def from_spec(spec: str) -> "_C.AttnBias":
    """Rebuilds the C++ bias a spec describes (cached: specs are immutable)."""
    return _build(json.loads(spec))._to_cpp()


def _build(d: dict) -> AttnBias:
    kind = d["type"]
    if kind == "causal":
        return CausalBias(d["variant"], d["q_len"], d["kv_len"])
    if kind == "local":
        return LocalAttentionBias(d["left"], d["right"], d["alignment"])
    if kind == "alibi":
        return AlibiBias(slopes=d["slopes"], alignment=d["alignment"])
    if kind == "block_diagonal":
        return BlockDiagonalBias(d["cu_seqlens_q"], d["cu_seqlens_kv"] or None, d["causal"],
                                 d["alignment"])
    if kind == "padded_keys":
        return PaddedKeysBias(d["kv_lengths"], d["causal"])
    if kind == "compose":
        return ComposedBias([_build(p) for p in d["parts"]])
    raise ValueError(f"bias spec: unknown type {kind!r}")


