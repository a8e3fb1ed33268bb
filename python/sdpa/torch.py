"""sdpa for PyTorch: the ``sdpa::attention`` custom op with a fake kernel and autograd.

``torch.ops.sdpa.attention`` (forward) and ``torch.ops.sdpa.attention_backward`` are
torch.library custom ops, so gradients flow through ``loss.backward()`` and calls trace
under ``torch.compile(fullgraph=True)`` as single opaque nodes::

    import sdpa.torch
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()

``sdpa.scaled_dot_product_attention`` routes torch tensors here by itself. Eager calls
with nothing to differentiate or trace skip the op (``_runs_eagerly``).

Biases: built-in ``sdpa.attention.bias`` objects (and torch's CausalBias) travel to the op
as a JSON string and run natively; others (Python subclasses, compositions with a tensor)
are materialized into a dense mask first, which happens outside the graph, so build those
before a compiled region or pass the dense tensor. Dropout: the op draws (seed, offset)
from sdpa's default generator at run time and returns it, so the backward replays the
same mask.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torch.utils import _python_dispatch
from torch.utils import dlpack as _dlpack

from . import _C
from .attention import bias as _bias

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_with_lse"]

# (seed, offset) travel as int64 schema ints: seeds are uint64, stored two's complement.
# An offset of -1 means "draw from sdpa's default generator inside the op".
_DRAW = -1
_U64 = 1 << 64


def _signed(u: int) -> int:
    return u - _U64 if u >= (1 << 63) else u


def _unsigned(s: int) -> int:
    return s + _U64 if s < 0 else s


def _capsule(t: Tensor) -> Any:
    """A DLPack capsule of `t` (read only by sdpa) through torch's C-level export:
    Tensor.__dlpack__'s Python checks cost about 2 us a tensor, a tiny call's whole kernel
    time."""
    return _dlpack.to_dlpack(t.detach() if t.requires_grad else t)


def _from_sdpa(t: "_C.Tensor") -> Tensor:
    return _dlpack.from_dlpack(t.__dlpack__())


def _run(query, key, value, attn_mask, bias, dropout_p, is_causal, scale, enable_gqa,
         dropout_seed, dropout_offset):
    """The op's work on real tensors: (out, lse, backend, (seed, offset) unsigned)."""
    if attn_mask is not None:
        mask = _capsule(attn_mask)
    else:
        mask = _bias.from_spec(bias) if bias else None
    state = None if dropout_offset < 0 else (_unsigned(dropout_seed), dropout_offset)
    out, lse, backend, drawn = _C.attention(
        _capsule(query), _capsule(key), _capsule(value), mask, dropout_p, is_causal, scale,
        enable_gqa, None, state)
    return _from_sdpa(out), _from_sdpa(lse), backend, tuple(drawn)


@torch.library.custom_op("sdpa::attention", mutates_args=())
def _attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor],
               bias: Optional[str], dropout_p: float, is_causal: bool, scale: Optional[float],
               enable_gqa: bool, dropout_seed: int,
               dropout_offset: int) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (out, lse float32, info int64 [seed, offset, backend])."""
    out, lse, backend, (seed, offset) = _run(query, key, value, attn_mask, bias, dropout_p,
                                             is_causal, scale, enable_gqa, dropout_seed,
                                             dropout_offset)
    info = torch.tensor([_signed(seed), offset, int(backend.value)], dtype=torch.int64)
    return out, lse, info


@_attention.register_fake
def _attention_fake(query, key, value, attn_mask, bias, dropout_p, is_causal, scale,
                    enable_gqa, dropout_seed, dropout_offset):
    out = query.new_empty((*query.shape[:-1], value.shape[-1]))
    lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
    info = query.new_empty((3,), dtype=torch.int64)
    return out, lse, info


@torch.library.custom_op("sdpa::attention_backward", mutates_args=())
def _attention_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                        out: Tensor, lse: Tensor, info: Tensor, attn_mask: Optional[Tensor],
                        bias: Optional[str], dropout_p: float, is_causal: bool,
                        scale: Optional[float], enable_gqa: bool,
                        attn_mask_requires_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (grad_q, grad_k, grad_v, grad_attn_mask or an empty tensor)."""
    state = None
    if dropout_p > 0:
        seed, offset = info[0].item(), info[1].item()
        state = (_unsigned(seed), offset)
    gq, gk, gv, gm = _run_backward(grad_out, query, key, value, out, lse, attn_mask, bias,
                                   dropout_p, is_causal, scale, enable_gqa, state,
                                   attn_mask_requires_grad)
    return gq, gk, gv, (gm if gm is not None else query.new_empty((0,)))


def _run_backward(grad_out, query, key, value, out, lse, attn_mask, bias, dropout_p,
                  is_causal, scale, enable_gqa, state, attn_mask_requires_grad):
    """The backward's work on real tensors: (grad_q, grad_k, grad_v, grad_attn_mask or
    None); `state` is the forward's (seed, offset) unsigned, or None without dropout."""
    if attn_mask is not None:
        mask = _capsule(attn_mask)
    else:
        mask = _bias.from_spec(bias) if bias else None
    gq, gk, gv, gm, _ = _C.attention_backward(
        _capsule(grad_out), _capsule(query), _capsule(key), _capsule(value), _capsule(out),
        _capsule(lse), mask, dropout_p, is_causal, scale, enable_gqa, state,
        attn_mask_requires_grad)
    return (_from_sdpa(gq), _from_sdpa(gk), _from_sdpa(gv),
            _from_sdpa(gm) if gm is not None else None)


@_attention_backward.register_fake
def _attention_backward_fake(grad_out, query, key, value, out, lse, info, attn_mask, bias,
                             dropout_p, is_causal, scale, enable_gqa, attn_mask_requires_grad):
    grad_mask = (attn_mask.new_empty(attn_mask.shape) if attn_mask_requires_grad
                 else query.new_empty((0,)))
    return (query.new_empty(query.shape), key.new_empty(key.shape),
            value.new_empty(value.shape), grad_mask)


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, bias, dropout_p, is_causal, scale, enable_gqa, _, _ = inputs
    out, lse, info = output
    ctx.save_for_backward(query, key, value, attn_mask, out, lse, info)
    ctx.options = (bias, dropout_p, is_causal, scale, enable_gqa)
    ctx.mark_non_differentiable(lse, info)


def _backward(ctx, grad_out, grad_lse, grad_info):
    query, key, value, attn_mask, out, lse, info = ctx.saved_tensors
    bias, dropout_p, is_causal, scale, enable_gqa = ctx.options
    mask_grad = attn_mask is not None and ctx.needs_input_grad[3]
    gq, gk, gv, gm = torch.ops.sdpa.attention_backward(
        grad_out, query, key, value, out, lse, info, attn_mask, bias, dropout_p, is_causal,
        scale, enable_gqa, mask_grad)
    return gq, gk, gv, (gm if mask_grad else None), None, None, None, None, None, None, None


_attention.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The sdpa::attention op's forward and backward as a plain autograd.Function, for
    eager calls that need gradients and that nothing records (_autograd_eagerly): the same
    kernels and dropout replay without the custom op's dispatch, which cost the MiniLM
    layer shape [5, 12, 27, 32] about 400 us per forward + backward. `info` (a list)
    receives (backend, (seed, offset))."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, bias, dropout_p, is_causal, scale,
                enable_gqa, dropout_seed, dropout_offset, info):
        out, lse, backend, drawn = _run(query, key, value, attn_mask, bias, dropout_p,
                                        is_causal, scale, enable_gqa, dropout_seed,
                                        dropout_offset)
        info.extend((backend, drawn))
        ctx.save_for_backward(query, key, value, attn_mask, out, lse)
        ctx.options = (bias, dropout_p, is_causal, scale, enable_gqa,
                       drawn if dropout_p > 0 else None)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_lse):
        query, key, value, attn_mask, out, lse = ctx.saved_tensors
        bias, dropout_p, is_causal, scale, enable_gqa, state = ctx.options
        mask_grad = attn_mask is not None and ctx.needs_input_grad[3]
        gq, gk, gv, gm = _run_backward(grad_out, query, key, value, out, lse, attn_mask, bias,
                                       dropout_p, is_causal, scale, enable_gqa, state,
                                       mask_grad)
        return gq, gk, gv, (gm if mask_grad else None), *(None,) * 8


def _mask_args(attn_mask: Any, query: Tensor,
               key: Tensor) -> tuple[Optional[Tensor], Optional[str]]:
    """(dense mask tensor, bias spec) for the op: at most one is set."""
    if attn_mask is None:
        return None, None
    spec = _bias.spec_of(attn_mask)  # before the Tensor test: torch's CausalBias is a Tensor
    if spec is not None:
        return None, spec
    if isinstance(attn_mask, Tensor):
        return attn_mask, None
    # A bias the op cannot rebuild (Python subclass, composition with a tensor, ...):
    # materialize it once, here, into the dense mask it stands for.
    if query.dim() == 4:
        shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    else:
        shape = (1, query.shape[0], query.shape[1], key.shape[1])
    cpp = _bias.to_cpp_mask(attn_mask)
    if not isinstance(cpp, _C.AttnBias):
        cpp = _C.tensor_bias(cpp)
    dense = torch.from_dlpack(cpp.materialize(shape, str(query.dtype).removeprefix("torch.")))
    if query.dim() == 3:
        dense = dense.squeeze(0) if dense.dim() == 4 else dense
    return dense.to(query.device), None


# Looked up once: _runs_eagerly runs on every call (getattr on torch modules costs
# microseconds); a torch without either cannot tell, and every call goes through the op.
_is_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
_in_dispatch_mode = getattr(_python_dispatch, "is_in_torch_dispatch_mode", None)


def _records_nothing(*tensors: Optional[Tensor]) -> bool:
    """Whether a call on these tensors may skip the sdpa::attention op: plain CPU tensors
    and nothing that records or redirects torch calls (torch.compile, __torch_function__
    subclasses and modes, dispatch modes such as FakeTensorMode or make_fx's tracer,
    functorch transforms). The op's dispatch and autograd wrapper cost 25-60 us a call,
    more than a short decode step's kernel."""
    if _is_functorch_wrapped is None or _in_dispatch_mode is None:
        return False
    if torch.compiler.is_compiling():
        return False
    for t in tensors:
        if t is None:
            continue
        if type(t) is not Tensor or not t.is_cpu or _is_functorch_wrapped(t):
            return False
    return not _in_dispatch_mode() and not torch.overrides.has_torch_function(tensors)


def _needs_grad(*tensors: Optional[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _runs_eagerly(*tensors: Optional[Tensor]) -> bool:
    """Whether a call runs the kernel directly: it records nothing (_records_nothing) and
    no tensor needs a gradient."""
    return _records_nothing(*tensors) and not _needs_grad(*tensors)


def _autograd_eagerly(*tensors: Optional[Tensor]) -> bool:
    """Whether a call that needs gradients runs through _EagerAttention instead of the op."""
    return _records_nothing(*tensors) and _needs_grad(*tensors)


def _call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, generator,
          dropout_state):
    """Returns (out, lse, info): the kernel directly (_runs_eagerly), through
    _EagerAttention (_autograd_eagerly) or else through the op; info is the op's int64
    [seed, offset, backend] tensor, or (backend, (seed, offset)) without the op."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor like query, got "
                            f"{type(x).__qualname__} (an array with __dlpack__ for "
                            "non-torch inputs)")
    mask, spec = _mask_args(attn_mask, query, key)
    seed, offset = 0, _DRAW
    if dropout_state is not None:
        seed, offset = _signed(int(dropout_state[0])), int(dropout_state[1])
    elif generator is not None and dropout_p > 0:
        s, o = generator.next_state()
        seed, offset = _signed(s), o
    args = (query, key, value, mask, spec, float(dropout_p), bool(is_causal),
            None if scale is None else float(scale), bool(enable_gqa), seed, offset)
    if _runs_eagerly(query, key, value, mask):
        out, lse, backend, drawn = _run(*args)
        return out, lse, (backend, drawn)
    if _autograd_eagerly(query, key, value, mask):
        info = []
        out, lse = _EagerAttention.apply(*args, info)
        return out, lse, tuple(info)
    return torch.ops.sdpa.attention(*args)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *,
                                 generator: Optional["_C.Generator"] = None) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention through the sdpa::attention op
    (differentiable in query, key, value and a float attn_mask)."""
    return _call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 generator, None)[0]


def scaled_dot_product_attention_with_lse(query: Tensor, key: Tensor, value: Tensor,
                                          attn_mask: Any = None, dropout_p: float = 0.0,
                                          is_causal: bool = False,
                                          scale: Optional[float] = None,
                                          enable_gqa: bool = False, *,
                                          generator: Optional["_C.Generator"] = None,
                                          dropout_state: Optional[tuple] = None):
    """Returns sdpa.AttentionOutput(out, lse, backend, dropout_state); ``out`` is
    differentiable, ``lse`` is not."""
    from ._api import AttentionOutput

    out, lse, info = _call(query, key, value, attn_mask, dropout_p, is_causal, scale,
                           enable_gqa, generator, dropout_state)
    if isinstance(info, Tensor):  # the op's [seed, offset, backend]
        seed, offset, backend = info.tolist()
        info = (_C.SDPBackend(backend), (_unsigned(seed), offset))
    return AttentionOutput(out, lse, *info)


class _FlexFunction(torch.autograd.Function):
    """flex_attention with autograd: q, k, v and the captured torch tensors are inputs, so
    gradients reach a learnable bias table; the backward is the library's (symbolic
    d(score_mod)/d(score), deterministic captured-tensor accumulation)."""

    @staticmethod
    def forward(ctx, flex_args, query, key, value, *captured):
        program, block_mask, scale, enable_gqa, names = flex_args
        out, lse, _ = _C.flex_attention(query.detach(), key.detach(), value.detach(), program,
                                        block_mask, scale, enable_gqa)
        out, lse = torch.from_dlpack(out), torch.from_dlpack(lse)
        ctx.flex_args = flex_args
        ctx.captured_shapes = [t.shape for t in captured]
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        program, block_mask, scale, enable_gqa, names = ctx.flex_args
        query, key, value, out, lse = ctx.saved_tensors
        gq, gk, gv, captured = _C.flex_attention_backward(
            grad_out.contiguous(), query.detach(), key.detach(), value.detach(), out, lse,
            program, block_mask, scale, enable_gqa)
        by_name = dict(zip(program.captured_names, captured)) if program is not None else {}
        # A 0-d tensor is captured as one element: its gradient takes the tensor's shape.
        grads = [None if by_name.get(n) is None
                 else torch.from_dlpack(by_name[n]).reshape(shape)
                 for n, shape in zip(names, ctx.captured_shapes)]
        return (None, torch.from_dlpack(gq), torch.from_dlpack(gk), torch.from_dlpack(gv),
                *grads)


def _flex_autograd(query: Tensor, key: Tensor, value: Tensor, program, block_mask, scale,
                   enable_gqa: bool, sources: dict):
    """(out, lse) of sdpa.flex_attention for torch tensors, differentiable in query, key,
    value and every captured torch tensor that requires grad."""
    names = [n for n, t in sources.items() if isinstance(t, torch.Tensor)]
    return _FlexFunction.apply((program, block_mask, scale, enable_gqa, names), query, key,
                               value, *(sources[n] for n in names))

