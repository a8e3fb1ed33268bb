"""The attention functions, for any array with __dlpack__.

torch tensors go through the ``sdpa::attention`` custom op (sdpa.torch), so autograd and
torch.compile see them; traced jax arrays (jax.jit, grad, vmap) through an XLA custom call
(sdpa._jax); every other array calls sdpa._C directly.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple, Optional

from . import _C, _convert
from .attention.bias import to_cpp_mask


class AttentionOutput(NamedTuple):
    """Result of scaled_dot_product_attention_with_lse."""

    out: Any  #: [B, Hq, L, Ev] (or [Hq, L, Ev]), the query's dtype and framework.
    lse: Any  #: float32 [B, Hq, L] logsumexp of the scaled, masked scores (-inf: fully masked).
    backend: Optional["_C.SDPBackend"]  #: The backend that ran.
    dropout_state: tuple  #: (seed, offset) the dropout used: pass it to the backward.


class AttentionGradients(NamedTuple):
    """Result of scaled_dot_product_attention_backward, each like its input."""

    grad_q: Any
    grad_k: Any
    grad_v: Any
    grad_attn_mask: Any  #: None unless attn_mask_requires_grad.
    backend: "_C.SDPBackend"


# sdpa.torch once an eager call has loaded it: the import statement below costs a tiny
# call 0.2 us (the relative form 0.4 us).
_torch_module = None


def _torch_api():
    global _torch_module
    module = _torch_module
    if module is None:
        # A plain import statement: torch.compile's tracer runs it (it cannot trace
        # importlib).
        import sdpa.torch as module

        # Never rebound under the tracer, whose guards would then see the global change
        # type within its own trace; the next eager call caches it.
        if not module._compiling():
            _torch_module = module
    return module


def _jax_traced(query: Any, key: Any, value: Any, attn_mask: Any) -> bool:
    """True when an argument is a traced jax array, without importing jax."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    tracer = jax.core.Tracer
    return (isinstance(query, tracer) or isinstance(key, tracer) or isinstance(value, tracer)
            or isinstance(attn_mask, tracer))


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 generator: Optional["_C.Generator"] = None,
                                 stream: Any = None) -> Any:
    """softmax(query @ key^T * scale + mask) @ value, with
    torch.nn.functional.scaled_dot_product_attention's arguments and semantics.

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (or 3-D without B), any
    strides, float32/float64/bfloat16/float16, from any framework with __dlpack__ (read
    zero-copy). attn_mask: None, a bool (True = take part) or float (added) array
    broadcastable to [B, Hq, L, S], or an sdpa.attention.bias bias. Returns out
    [B, Hq, L, Ev] in the query's framework. Raises sdpa.Error (a ValueError and a RuntimeError) with the
    library's message for invalid input, TypeError for non-arrays.

    CUDA arrays: the call is queued on ``stream`` (a cudaStream_t as an int, or an object
    with ``.cuda_stream`` such as torch.cuda.Stream) and returns without waiting; None
    means torch's current stream for torch tensors (as torch's own ops) and the legacy
    default stream otherwise. The output is device memory, valid in the stream's order.
    CPU arrays ignore ``stream``.

    jax: traced arrays (inside jax.jit, jax.grad, jax.vmap) run as an XLA custom call on
    the CPU, differentiable in query, key, value and a float attn_mask; dropout_p must be
    0 and attn_mask an array (sdpa._jax.attention). The backends allowed (sdpa_kernel) are
    those when the function is traced.
    """
    if _convert.is_torch_tensor(query):
        return _torch_api().scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
            generator=generator, stream=stream)
    if _jax_traced(query, key, value, attn_mask):
        from . import _jax
        return _jax.attention(query, key, value, attn_mask, _dropout(dropout_p), is_causal,
                              _scale(scale), enable_gqa)[0]
    out, _, _, _ = _C.attention(query, key, value, to_cpp_mask(attn_mask), _dropout(dropout_p),
                                bool(is_causal), _scale(scale), bool(enable_gqa),
                                _convert.generator(generator), None,
                                _convert.stream_handle(stream))
    return _convert.like(out, query)


def scaled_dot_product_attention_with_lse(
        query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
        is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False, *,
        generator: Optional["_C.Generator"] = None,
        dropout_state: Optional[tuple] = None, stream: Any = None,
        dropout_position: Optional[tuple] = None) -> AttentionOutput:
    """As scaled_dot_product_attention, also returning the logsumexp, the backend that
    ran and the dropout state. ``dropout_state=(seed, offset)`` replays a previous call's
    dropout mask instead of drawing from the generator. torch tensors go through the
    custom op (gradients flow to ``out``; ``lse`` is not differentiable). ``stream``: as
    scaled_dot_product_attention's. Traced jax arrays: backend None (chosen when the
    computation runs), dropout_state (0, 0), and ``lse`` must not be differentiated (wrap
    it in jax.lax.stop_gradient).

    ``dropout_position=(q_offset, kv_offset, q_len, kv_len)``: this call is the block of
    queries [q_offset, q_offset + L) x keys [kv_offset, kv_offset + S) of a whole call of
    q_len x kv_len, and draws the dropout mask that call would (context parallelism; CPU
    backends). torch tensors are then computed without autograd."""
    position = _convert.dropout_position(dropout_position)
    if _convert.is_torch_tensor(query) and position is not None:
        query, key, value = query.detach(), key.detach(), value.detach()
    elif _convert.is_torch_tensor(query):
        return _torch_api().scaled_dot_product_attention_with_lse(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
            generator=generator, dropout_state=dropout_state, stream=stream)
    if _jax_traced(query, key, value, attn_mask):
        from . import _jax
        out, lse = _jax.attention(query, key, value, attn_mask, _dropout(dropout_p),
                                  is_causal, _scale(scale), enable_gqa)
        return AttentionOutput(out, lse, None, (0, 0))
    out, lse, backend, state = _C.attention(
        query, key, value, to_cpp_mask(attn_mask), _dropout(dropout_p), bool(is_causal),
        _scale(scale), bool(enable_gqa), _convert.generator(generator),
        _convert.dropout_state(dropout_state), _convert.stream_handle(stream), position)
    return AttentionOutput(_convert.like(out, query), _convert.like(lse, query), backend,
                           tuple(state))


def scaled_dot_product_attention_backward(
        grad_out: Any, query: Any, key: Any, value: Any, out: Any, lse: Any,
        attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
        scale: Optional[float] = None, enable_gqa: bool = False, *,
        dropout_state: Optional[tuple] = None,
        attn_mask_requires_grad: bool = False, stream: Any = None,
        dropout_position: Optional[tuple] = None) -> AttentionGradients:
    """Gradients of scaled_dot_product_attention with respect to query, key, value (and a
    float attn_mask when ``attn_mask_requires_grad``), given grad_out and the forward's
    ``out`` and ``lse``. The options must equal the forward's; with dropout,
    ``dropout_state`` must be the forward's (AttentionOutput.dropout_state).
    Returns AttentionGradients(grad_q, grad_k, grad_v, grad_attn_mask, backend) in the
    query's framework (torch tensors are read, not tracked: use sdpa.torch for autograd).
    ``stream``: as scaled_dot_product_attention's; ``dropout_position``: the forward's
    (scaled_dot_product_attention_with_lse).
    """
    gq, gk, gv, gm, backend = _C.attention_backward(
        grad_out, query, key, value, out, lse, to_cpp_mask(attn_mask), _dropout(dropout_p),
        bool(is_causal), _scale(scale), bool(enable_gqa), _convert.dropout_state(dropout_state),
        bool(attn_mask_requires_grad), _convert.stream_handle(stream, query),
        _convert.dropout_position(dropout_position))
    return AttentionGradients(_convert.like(gq, query), _convert.like(gk, query),
                              _convert.like(gv, query),
                              None if gm is None else _convert.like(gm, query), backend)


def explain(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False,
            *, backward: bool = False) -> "_C.Explanation":
    """Which backend a call would use and why every other was rejected, without running
    it. Returns an Explanation: ``.chosen``, ``.verdicts`` (backend, allowed, supported,
    reasons, bias_handling), and ``str()`` for the text ``sdpa explain`` prints. With
    ``backward``, explains the backward call instead. Never raises for an unsupported
    call (only for invalid input)."""
    return _C.explain(query, key, value, to_cpp_mask(attn_mask), _dropout(dropout_p),
                      bool(is_causal), _scale(scale), bool(enable_gqa), bool(backward))


def _dropout(dropout_p: Any) -> float:
    return _convert.number(dropout_p, "dropout_p")


def _scale(scale: Any) -> Optional[float]:
    return None if scale is None else _convert.number(scale, "scale")
