"""A differentiable backward for the torch entry points: the attention's gradients written
as torch operations on the math formula, so that a second derivative (create_graph=True,
torch.autograd.gradgradcheck, Hessian-vector products) can flow through them.

The kernels' backward is not differentiable, so this runs only when the backward itself
records a graph; first derivatives keep the kernels. Semantics are sdpa's MATH ones:
softmax(q k^T * scale + mask) v with GQA, top-left is_causal, and rows that see no key
giving 0 (and no gradient) rather than NaN.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import _C


def _forward(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        group = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(group, dim=-3)
        value = value.repeat_interleave(group, dim=-3)
    E = query.shape[-1]
    s = scale if scale is not None else (1.0 / math.sqrt(E) if E else 1.0)
    scores = query @ key.transpose(-2, -1) * s
    L, S = scores.shape[-2], scores.shape[-1]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    # A row without a finite score sees no key: 0, with no gradient through it.
    dead = ~torch.isfinite(scores).any(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    return probs @ value


def differentiable_grads(grad_out, query, key, value, attn_mask: Optional[torch.Tensor],
                         dropout_p: float, is_causal: bool, scale: Optional[float],
                         enable_gqa: bool, mask_grad: bool) -> tuple:
    """(grad_q, grad_k, grad_v, grad_attn_mask or None) of the attention at these inputs
    for grad_out, as a graph of torch operations (create_graph). attn_mask: None, a bool
    mask or an additive float mask (a bias materialized by the caller). Raises sdpa.Error
    for dropout_p > 0: its mask is drawn inside the kernels and has no torch form."""
    if dropout_p > 0:
        raise _C.Error("double backward: dropout_p > 0 has no differentiable backward (the "
                       "dropout mask is drawn inside the kernels); use dropout_p = 0")
    inputs = [query, key, value] + ([attn_mask] if mask_grad else [])
    with torch.enable_grad():
        out = _forward(query, key, value, attn_mask, is_causal, scale, enable_gqa)
        grads = torch.autograd.grad(out, inputs, grad_out, create_graph=True,
                                    allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, inputs)]
    return (*grads[:3], grads[3] if mask_grad else None)
