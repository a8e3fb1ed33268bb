"""jax.jit, jax.grad and jax.vmap over sdpa's attention.

A traced jax array has no data to read through DLPack, so sdpa/_api.py routes calls with
tracers here. The attention becomes an XLA FFI custom call whose handlers
(python/src/jax_ffi.cpp) run sdpa's C++ forward and backward on XLA's buffers when the
compiled computation runs; jax.custom_vjp pairs the forward with sdpa's backward. Only
_api.py imports this module, and only once jax itself is imported.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from . import _C
from .attention.bias import AttnBias

_FORWARD = "sdpa_attention_forward"
_BACKWARD = "sdpa_attention_backward"


class _Static(NamedTuple):
    """A call's options, fixed at trace time (hashable: custom_vjp's static argument)."""

    is_causal: bool
    scale: Optional[float]
    enable_gqa: bool
    # SDPBackend values in the order they are tried, read from the sdpa_kernel guard and
    # enable flags when the call is traced: the handler runs later, on an XLA thread.
    backends: tuple


@functools.cache
def _register_targets() -> None:
    # Not cached when it raises, so a later call raises again.
    targets = getattr(_C, "jax_ffi_targets", None)
    if targets is None:
        raise _C.Error(
            "jax.jit/grad/vmap over sdpa need the XLA FFI handlers, and this sdpa was built "
            "without jax's XLA FFI headers. Rebuild with jax importable by the building "
            "Python, or pass -C cmake.define.SDPA_XLA_FFI_INCLUDE_DIR=\"$(python -c 'import "
            "jax.ffi; print(jax.ffi.include_dir())')\" to pip install. Eager (untraced) jax "
            "arrays work without them.")
    for name, capsule in targets().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")


def attention(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: float,
              is_causal: bool, scale: Optional[float], enable_gqa: bool) -> tuple:
    """Returns (out [*, L, Ev] of the query's dtype, lse [*, L] float32) for jax arrays of
    which at least one is traced, with scaled_dot_product_attention's semantics (fully
    masked rows give out 0 and lse -inf).

    query [*, L, E], key [*, S, E], value [*, S, Ev]: float32/bfloat16/float16 (float64
    with jax_enable_x64); attn_mask None or a bool (True = take part) / query-dtype float
    array broadcastable to [*, Hq, L, S]. Differentiable in query, key, value and a float
    attn_mask (its gradient summed over its broadcast dimensions); not in lse. Raises
    sdpa.Error for dropout_p > 0 and for an empty backend list, TypeError for an sdpa bias
    object; invalid shapes or dtypes fail when the computation runs, with sdpa's message
    (naming the argument) in jax's exception.
    """
    if dropout_p != 0.0:
        raise _C.Error(f"dropout_p: dropout is not supported under jax transformations (jit, "
                       f"grad, vmap), got dropout_p={dropout_p}")
    if isinstance(attn_mask, (AttnBias, _C.AttnBias)) or hasattr(attn_mask, "materialize"):
        raise TypeError("attn_mask: sdpa bias objects are not supported under jax "
                        "transformations; pass a bool or float array (bias.materialize)")
    _register_targets()
    backends = tuple(b.value for b in _C.active_backends())
    if not backends:
        raise _C.Error("no attention backend is allowed: every backend is disabled")
    arrays = [jnp.asarray(x) for x in (query, key, value)]
    for name, x in zip(("query", "key", "value"), arrays):
        if x.ndim < 2:
            raise _C.Error(f"{name}: expected at least 2 dimensions [*, L, E], got shape "
                           f"{x.shape}")
    mask = None if attn_mask is None else jnp.asarray(attn_mask)
    # One rank (at least 4) for every input, size-1 dimensions prepended: jax.vmap then
    # adds its batch dimension to the left of each, where right-aligned broadcasting
    # between the inputs stays as it was.
    rank = max(4, *(x.ndim for x in arrays), 0 if mask is None else mask.ndim)
    q, k, v = (_with_rank(x, rank) for x in arrays)
    mask = None if mask is None else _with_rank(mask, rank)
    static = _Static(bool(is_causal), scale, bool(enable_gqa), backends)
    out, lse = _attention(static, q, k, v, mask)
    q_lead = arrays[0].shape[:-1]
    return out.reshape(q_lead + arrays[2].shape[-1:]), lse.reshape(q_lead)


def _with_rank(x: jax.Array, rank: int) -> jax.Array:
    return x.reshape((1,) * (rank - x.ndim) + x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static: _Static, q, k, v, mask):
    return _forward(static, q, k, v, mask)


def _attention_fwd(static: _Static, q, k, v, mask):
    # symbolic_zeros=True: each array arrives as CustomVJPPrimal(value, perturbed), so the
    # mask's gradient is computed only when something differentiates it.
    mask_grad = (mask is not None and mask.perturbed
                 and jnp.issubdtype(mask.value.dtype, jnp.floating))
    q, k, v = q.value, k.value, v.value
    mask = None if mask is None else mask.value
    out, lse = _forward(static, q, k, v, mask)
    # Residuals are arrays; the dict's key (pytree structure, static) carries the choice.
    masks = {"differentiated" if mask_grad else "constant": mask}
    return (out, lse), (q, k, v, out, lse, masks)


def _attention_bwd(static: _Static, residuals, cotangents):
    q, k, v, out, lse, masks = residuals
    grad_out, grad_lse = cotangents
    if not isinstance(grad_lse, SymbolicZero):
        raise NotImplementedError(
            "lse: sdpa's backward takes no logsumexp gradient; apply jax.lax.stop_gradient "
            "to the lse of scaled_dot_product_attention_with_lse before differentiating")
    if isinstance(grad_out, SymbolicZero):
        return None, None, None, None
    ((kind, mask),) = masks.items()
    if kind == "constant":
        return (*_backward(static, grad_out, q, k, v, out, lse, mask), None)
    return _backward_with_mask_grad(static, grad_out, q, k, v, out, lse, mask)


_attention.defvjp(_attention_fwd, _attention_bwd, symbolic_zeros=True)


def _attributes(static: _Static) -> dict:
    """The handlers' attributes (python/src/jax_ffi.cpp), typed as they decode them."""
    return {
        "is_causal": np.bool_(static.is_causal),
        "has_scale": np.bool_(static.scale is not None),
        "scale": np.float64(0.0 if static.scale is None else static.scale),
        "enable_gqa": np.bool_(static.enable_gqa),
        "backends": np.asarray(static.backends, dtype=np.int32),
    }


def _like(x: jax.Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _forward(static: _Static, q, k, v, mask):
    """(out, lse) of the custom call. vmap_method="expand_dims": an unbatched input gets a
    size-1 batch dimension and the handler broadcasts it (no copy)."""
    results = (jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype),
               jax.ShapeDtypeStruct(q.shape[:-1], jnp.float32))
    call = jax.ffi.ffi_call(_FORWARD, results, vmap_method="expand_dims")
    masks = () if mask is None else (mask,)
    return call(q, k, v, *masks, **_attributes(static))


def _backward(static: _Static, grad_out, q, k, v, out, lse, mask):
    """(dq, dk, dv) of the custom call, each like its input."""
    call = jax.ffi.ffi_call(_BACKWARD, (_like(q), _like(k), _like(v)),
                            vmap_method="expand_dims")
    masks = () if mask is None else (mask,)
    return call(grad_out, q, k, v, out, lse, *masks, **_attributes(static))


def _backward_with_mask_grad(static: _Static, grad_out, q, k, v, out, lse, mask):
    """(dq, dk, dv, dmask). sdpa computes a mask gradient only for 4-D calls whose key and
    value are broadcast nowhere but in the grouped-query head dimension, so the batch
    dimensions are broadcast and merged here and jax.vmap runs the call once per batch
    element (vmap_method="sequential"); gradients are then summed back to the inputs'
    shapes."""
    lead = q.shape[:-3]
    kv_heads = k.shape[-3] if static.enable_gqa else q.shape[-3]
    qf, gf, of = (x.reshape((-1,) + x.shape[-3:]) for x in (q, grad_out, out))
    lf = lse.reshape((-1,) + lse.shape[-2:])
    kf = _merge_batch(k, lead + (kv_heads,))
    vf = _merge_batch(v, lead + (kv_heads,))
    # A mask shared by the whole batch stays one copy.
    mask_lead = lead if any(n != 1 for n in mask.shape[:-3]) else (1,) * len(lead)
    mf = _merge_batch(mask, mask_lead + mask.shape[-3:-2])
    call = jax.ffi.ffi_call(_BACKWARD, (_like(qf), _like(kf), _like(vf), _like(mf)),
                            vmap_method="sequential")
    dq, dk, dv, dmask = call(gf, qf, kf, vf, of, lf, mf, **_attributes(static))
    return (dq.reshape(q.shape), _sum_to(dk, lead + (kv_heads,) + k.shape[-2:], k.shape),
            _sum_to(dv, lead + (kv_heads,) + v.shape[-2:], v.shape),
            _sum_to(dmask, mask_lead + mask.shape[-3:], mask.shape))


def _merge_batch(x: jax.Array, lead: tuple) -> jax.Array:
    """x [*, H, a, b] broadcast to `lead` ([*, H]) and reshaped to [prod(*), H, a, b]."""
    x = jnp.broadcast_to(x, lead + x.shape[-2:])
    return x.reshape((-1,) + x.shape[-3:])


def _sum_to(grad: jax.Array, full: tuple, shape: tuple) -> jax.Array:
    """grad [prod, H, a, b], reshaped to `full`, summed over the dimensions where `shape`
    (the input's, same rank) was broadcast."""
    grad = grad.reshape(full)
    axes = tuple(d for d, (n, m) in enumerate(zip(shape, full)) if n == 1 and m != 1)
    return grad.sum(axis=axes, keepdims=True) if axes else grad
