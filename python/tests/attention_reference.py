"""float64 numpy reference of scaled dot-product attention, forward and backward.

The oracle of the numpy-only tests (no torch needed): the obvious formulas, evaluated in
float64 whatever the input dtype.
"""

from __future__ import annotations

import numpy as np

# Tolerances (atol, rtol) against the float64 reference, per input dtype.
TOLERANCES = {
    np.float64: (1e-10, 1e-9),
    np.float32: (2e-5, 1e-4),
    np.float16: (3e-3, 1e-2),
}


def tolerance(dtype) -> dict:
    atol, rtol = TOLERANCES[np.dtype(dtype).type]
    return {"atol": atol, "rtol": rtol}


def _expand_kv(x: np.ndarray, heads_q: int) -> np.ndarray:
    return np.repeat(x, heads_q // x.shape[-3], axis=-3)


def causal_keep(L: int, S: int, lower_right: bool = False) -> np.ndarray:
    """[L, S] bool: True where query i may see key j."""
    d = S - L if lower_right else 0
    return np.arange(S)[None, :] <= np.arange(L)[:, None] + d


def forward(q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False, dropout=None):
    """Returns (out, lse, P) in float64; P are the (undropped) probabilities.

    mask: bool (True = take part) or additive float, broadcastable to the scores.
    dropout: optional [.., L, S] multiplier (0 or 1/(1-p)) applied to P before P @ V.
    Fully masked rows give out 0 and lse -inf.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if enable_gqa:
        k, v = _expand_kv(k, q.shape[-3]), _expand_kv(v, q.shape[-3])
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    L, S = s.shape[-2:]
    if is_causal:
        s = np.where(causal_keep(L, S), s, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, denom, out=np.zeros_like(e), where=denom > 0)
    with np.errstate(divide="ignore"):
        lse = (np.log(denom) + m)[..., 0]
    pd = p if dropout is None else p * dropout
    return pd @ v, lse, p


def backward(grad_out, q, k, v, mask=None, is_causal=False, scale=None, enable_gqa=False,
             dropout=None):
    """Returns (dq, dk, dv, dmask) in float64 (dmask: gradient of an additive mask, summed
    to the mask's shape; None for bool or no mask)."""
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    g = np.asarray(grad_out, dtype=np.float64)
    out, _, p = forward(q, k, v, mask, is_causal, scale, enable_gqa, dropout)
    hq, hkv = q64.shape[-3], k64.shape[-3]
    ke, ve = (_expand_kv(k64, hq), _expand_kv(v64, hq)) if enable_gqa else (k64, v64)
    scale = 1.0 / np.sqrt(q64.shape[-1]) if scale is None else scale
    pd = p if dropout is None else p * dropout
    dv = np.swapaxes(pd, -1, -2) @ g
    dpd = g @ np.swapaxes(ve, -1, -2)
    dp = dpd if dropout is None else dpd * dropout
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = ds @ ke * scale
    dk = np.swapaxes(ds, -1, -2) @ q64 * scale
    if enable_gqa and hq != hkv:
        group = hq // hkv
        dk = dk.reshape(*dk.shape[:-3], hkv, group, *dk.shape[-2:]).sum(axis=-3)
        dv = dv.reshape(*dv.shape[:-3], hkv, group, *dv.shape[-2:]).sum(axis=-3)
    dmask = None
    if mask is not None and np.asarray(mask).dtype != bool:
        dmask = _sum_to(ds, np.asarray(mask).shape)
    return dq, dk, dv, dmask


def _sum_to(x: np.ndarray, shape: tuple) -> np.ndarray:
    while x.ndim > len(shape):
        x = x.sum(axis=0)
    for axis, n in enumerate(shape):
        if n == 1 and x.shape[axis] != 1:
            x = x.sum(axis=axis, keepdims=True)
    return x
