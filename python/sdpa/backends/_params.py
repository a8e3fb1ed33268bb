"""torch.backends.cuda's per-call checks (SDPAParams, can_use_*_attention) on sdpa's
backend checks."""

from __future__ import annotations

import warnings
from typing import Any

from .. import _C
from .._api import explain


class SDPAParams:
    """The inputs of one attention call, for the ``can_use_*`` checks; torch's
    ``torch.backends.cuda.SDPAParams``, with the same positional order.

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (any array sdpa
    accepts: numpy, torch, DLPack), ``attn_mask`` (None, a bool or additive array, or an
    sdpa bias), ``dropout`` (the probability), ``is_causal``, ``enable_gqa``. Nothing is
    checked until a ``can_use_*`` call; torch's own SDPAParams objects are accepted there
    too.
    """

    __slots__ = ("query", "key", "value", "attn_mask", "dropout", "is_causal", "enable_gqa")

    def __init__(self, query: Any, key: Any, value: Any, attn_mask: Any = None,
                 dropout: float = 0.0, is_causal: bool = False,
                 enable_gqa: bool = False) -> None:
        self.query, self.key, self.value = query, key, value
        self.attn_mask = attn_mask
        self.dropout = dropout
        self.is_causal = is_causal
        self.enable_gqa = enable_gqa

    def __repr__(self) -> str:
        return (f"SDPAParams(dropout={self.dropout}, is_causal={self.is_causal}, "
                f"enable_gqa={self.enable_gqa}, attn_mask="
                f"{'None' if self.attn_mask is None else type(self.attn_mask).__name__})")


def _can_use(backend: "_C.SDPBackend", params: Any, debug: bool) -> bool:
    # Like torch's, the check is of the call's constraints only: enable_*_sdp switches
    # and sdpa_kernel guards do not change the answer.
    verdicts = explain(params.query, params.key, params.value, params.attn_mask,
                       params.dropout, params.is_causal,
                       enable_gqa=bool(getattr(params, "enable_gqa", False))).verdicts
    verdict = next(v for v in verdicts if v.backend == backend)
    if debug and not verdict.supported:
        for reason in verdict.reasons:
            warnings.warn(f"{backend.name}: {reason}", UserWarning, stacklevel=3)
    return bool(verdict.supported)


def can_use_flash_attention(params: Any, debug: bool = False) -> bool:
    """Whether FLASH_ATTENTION can run the call ``params`` describes (an SDPAParams, or
    torch's); with ``debug``, each reason it cannot is emitted as a UserWarning, as
    torch's ``torch.backends.cuda.can_use_flash_attention`` does. Raises sdpa.Error for
    invalid input (mismatched shapes, unsupported dtypes)."""
    return _can_use(_C.SDPBackend.FLASH_ATTENTION, params, debug)


def can_use_efficient_attention(params: Any, debug: bool = False) -> bool:
    """Whether EFFICIENT_ATTENTION can run the call; as :func:`can_use_flash_attention`."""
    return _can_use(_C.SDPBackend.EFFICIENT_ATTENTION, params, debug)


def can_use_cudnn_attention(params: Any, debug: bool = False) -> bool:
    """Whether CUDNN_ATTENTION can run the call; as :func:`can_use_flash_attention`."""
    return _can_use(_C.SDPBackend.CUDNN_ATTENTION, params, debug)
