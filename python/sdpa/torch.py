"""sdpa for PyTorch: the ``sdpa::attention`` custom op with a fake kernel and autograd.

``torch.ops.sdpa.attention`` (forward) and ``torch.ops.sdpa.attention_backward`` are
torch.library custom ops, so gradients flow through ``loss.backward()`` and calls trace
under ``torch.compile(fullgraph=True)`` as single opaque nodes::

    import sdpa.torch
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()

``sdpa.scaled_dot_product_attention`` routes torch tensors here by itself. Eager calls
that nothing records skip the op (``_route``): without gradients the kernel runs directly,
in one call into sdpa._C (``torch_eager_attention``); with them through
``_EagerAttention``. Tensors cross into the library through torch's C-level DLPack
functions, called from C++ (python/src/torch.cpp).

Biases: built-in ``sdpa.attention.bias`` objects (and torch's CausalBias) travel to the op
as a JSON string and run natively; others (Python subclasses, compositions with a tensor)
are materialized into a dense mask first, which happens outside the graph, so build those
before a compiled region or pass the dense tensor. Dropout: the op draws (seed, offset)
from sdpa's default generator at run time and returns it, so the backward replays the
same mask.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from typing import Any, Optional

import torch
from torch import Tensor
from torch.utils import _python_dispatch

from . import _C, _convert
from ._api import AttentionOutput
from ._kernel import current_restriction, restricted, sdpa_kernel
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


# torch's functions for the bindings (python/src/torch.cpp), which export, import and
# check tensors without Python in between: Tensor.__dlpack__'s Python checks cost about
# 2 us a tensor, a tiny call's whole kernel time, and each Python-level step of a call
# costs tenths of a microsecond. A torch without one of the queries cannot tell what
# records a call: every call then takes the op.
def _register_torch(exchange_api: Any = getattr(Tensor, "__dlpack_c_exchange_api__", None)):
    """Hands torch's functions to the bindings; exchange_api None makes them use
    torch._C._to_dlpack / _from_dlpack (as on a torch before 2.10). Returns whether they
    use the exchange table."""
    return _C.register_torch(Tensor, torch._C._to_dlpack, torch._C._from_dlpack, exchange_api,
                      getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None),
                      getattr(_python_dispatch, "is_in_torch_dispatch_mode", None),
                      getattr(torch._C, "_is_torch_function_mode_enabled", None),
                      torch.is_grad_enabled, _current_stream,
                      getattr(torch._C, "_get_math_sdp_allow_fp16_bf16_reduction", None))


def _current_stream(device_index: int) -> int:
    """torch's current cudaStream_t for a CUDA device (the bindings' fallback for a torch
    whose exchange table lacks current_work_stream)."""
    return torch.cuda.current_stream(device_index).cuda_stream


_register_torch()


# torch's own backend switches (torch.nn.attention.sdpa_kernel and
# torch.backends.cuda.enable_*_sdp set them), each with the sdpa backend of its name.
_TORCH_BACKEND_SWITCHES = tuple(
    (name, getattr(torch._C, getter)) for name, getter in (
        ("MATH", "_get_math_sdp_enabled"),
        ("FLASH_ATTENTION", "_get_flash_sdp_enabled"),
        ("EFFICIENT_ATTENTION", "_get_mem_efficient_sdp_enabled"),
        ("CUDNN_ATTENTION", "_get_cudnn_sdp_enabled"),
        ("OVERRIDEABLE", "_get_overrideable_sdp_enabled"),
    ) if hasattr(torch._C, getter))


def _torch_allowed() -> Optional[list]:
    """The backends torch's own guard (or torch.backends' switches) leaves enabled, by
    name; None where torch leaves every backend on or an sdpa guard is active (sdpa's own
    guard wins). Raises sdpa.Error where torch turns every backend off (torch: "No
    available kernel")."""
    allowed = [name for name, enabled in _TORCH_BACKEND_SWITCHES if enabled()]
    if len(allowed) == len(_TORCH_BACKEND_SWITCHES) or _C.sdpa_kernel_active():
        return None
    if not allowed:
        raise _C.Error("backends: torch.nn.attention.sdpa_kernel (or torch.backends) "
                       "disables every SDPA backend; expected at least one enabled")
    return allowed


def _torch_guard():
    """An sdpa_kernel guard for _torch_allowed(), or None."""
    allowed = _torch_allowed()
    return None if allowed is None else sdpa_kernel(allowed)


def _forward_restriction() -> Optional[list]:
    """The backends a forward may use in the order they are tried, recorded for its
    backward (current_restriction): sdpa's guard, else torch's."""
    allowed = _torch_allowed()
    if allowed is None:
        return current_restriction()
    return [b for b in _C.default_priority_order() if _C.backend_name(b) in allowed]


def _run(query, key, value, attn_mask, bias, dropout_p, is_causal, scale, enable_gqa,
         dropout_seed, dropout_offset):
    """The op's work on real tensors: (out, lse, backend, (seed, offset) unsigned), under
    torch's guard (_torch_guard) as well as sdpa's."""
    guard = _torch_guard()
    if guard is not None:
        with guard:
            return _run(query, key, value, attn_mask, bias, dropout_p, is_causal, scale,
                        enable_gqa, dropout_seed, dropout_offset)
    if attn_mask is None and bias:
        attn_mask = _bias.from_spec(bias)
    state = None if dropout_offset < 0 else (_unsigned(dropout_seed), dropout_offset)
    return _C.torch_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                              enable_gqa, None, state, True)


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
    # On the CPU whatever the query's device, as the real kernel's (read by .tolist()).
    info = torch.empty((3,), dtype=torch.int64, device="cpu")
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
    if attn_mask is None and bias:
        attn_mask = _bias.from_spec(bias)
    return _C.torch_attention_backward(grad_out, query, key, value, out, lse, attn_mask,
                                       dropout_p, is_causal, scale, enable_gqa, state,
                                       attn_mask_requires_grad)


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
    ctx.backends = _forward_restriction()
    ctx.mark_non_differentiable(lse, info)


def _second_order(query, key, value, attn_mask, bias, grad_out, options, mask_grad):
    """The gradients as a differentiable graph (_math_grads), for a backward that records
    one (create_graph=True)."""
    from ._math_grads import differentiable_grads

    if attn_mask is None and bias:
        attn_mask = _materialize(_bias.from_spec(bias), query, key)
    dropout_p, is_causal, scale, enable_gqa = options
    gq, gk, gv, gm = differentiable_grads(grad_out, query, key, value, attn_mask, dropout_p,
                                          is_causal, scale, enable_gqa, mask_grad)
    return gq, gk, gv, gm


def _backward(ctx, grad_out, grad_lse, grad_info):
    query, key, value, attn_mask, out, lse, info = ctx.saved_tensors
    bias, dropout_p, is_causal, scale, enable_gqa = ctx.options
    mask_grad = attn_mask is not None and ctx.needs_input_grad[3]
    if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
        gq, gk, gv, gm = _second_order(query, key, value, attn_mask, bias, grad_out,
                                       (dropout_p, is_causal, scale, enable_gqa), mask_grad)
        return gq, gk, gv, gm, None, None, None, None, None, None, None
    with restricted(ctx.backends):
        gq, gk, gv, gm = torch.ops.sdpa.attention_backward(
            grad_out, query, key, value, out, lse, info, attn_mask, bias, dropout_p, is_causal,
            scale, enable_gqa, mask_grad)
    return gq, gk, gv, (gm if mask_grad else None), None, None, None, None, None, None, None


_attention.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The sdpa::attention op's forward and backward as a plain autograd.Function, for
    eager calls that need gradients and that nothing records (_route): the same
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
        ctx.backends = _forward_restriction()
        ctx.mark_non_differentiable(lse)
        # The backward ignores grad_lse: skip the zeros autograd would make for it.
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        if torch.is_grad_enabled() and grad_out is not None:
            # create_graph=True: the kernels' gradients are not differentiable; the math
            # formula's are (second derivatives, gradgradcheck).
            query, key, value, attn_mask, _, _ = ctx.saved_tensors
            bias, dropout_p, is_causal, scale, enable_gqa, _ = ctx.options
            mask_grad = attn_mask is not None and ctx.needs_input_grad[3]
            grads = _second_order(query, key, value, attn_mask, bias, grad_out,
                                  (dropout_p, is_causal, scale, enable_gqa), mask_grad)
            return *grads, *(None,) * 8
        # The engine runs a backward without create_graph in no_grad already.
        return _EagerAttention._backward(ctx, grad_out, grad_lse)

    @staticmethod
    def _backward(ctx, grad_out, grad_lse):
        if grad_out is None:  # lse is not differentiable: nothing reached this call
            return (None,) * 12
        query, key, value, attn_mask, out, lse = ctx.saved_tensors
        bias, dropout_p, is_causal, scale, enable_gqa, state = ctx.options
        mask_grad = attn_mask is not None and ctx.needs_input_grad[3]
        with restricted(ctx.backends):
            gq, gk, gv, gm = _run_backward(grad_out, query, key, value, out, lse, attn_mask,
                                           bias, dropout_p, is_causal, scale, enable_gqa, state,
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
    return _materialize(attn_mask, query, key), None


def _materialize(bias: Any, query: Tensor, key: Tensor) -> Tensor:
    """The dense additive mask (query's dtype and device) an attention bias stands for."""
    if query.dim() == 4:
        shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    else:
        shape = (1, query.shape[0], query.shape[1], key.shape[1])
    cpp = _bias.to_cpp_mask(bias)
    if not isinstance(cpp, _C.AttnBias):
        cpp = _C.tensor_bias(cpp)
    dense = torch.from_dlpack(cpp.materialize(shape, str(query.dtype).removeprefix("torch.")))
    if query.dim() == 3:
        dense = dense.squeeze(0) if dense.dim() == 4 else dense
    return dense.to(query.device)


# A call's route (_C.torch_route): through the sdpa::attention op, the kernel directly, or
# through _EagerAttention. The op's dispatch and autograd wrapper cost 25-60 us a call,
# more than a short decode step's kernel, so eager calls that nothing records skip it.
_THROUGH_OP, _DIRECT, _AUTOGRAD = 0, 1, 2

# Tested in Python before any call into sdpa._C: torch.compile's tracer reads it as True
# (and so keeps the op) and could not trace the extension's functions anyway.
_compiling = torch.compiler.is_compiling


def _route(*tensors: Optional[Tensor]) -> int:
    """How a call on these tensors (None skipped) runs: _DIRECT when nothing records it
    (not compiling, no dispatch or __torch_function__ mode, every tensor exactly a CPU
    torch.Tensor that no functorch transform wraps) and no gradient is needed;
    _AUTOGRAD when one is; _THROUGH_OP otherwise."""
    if _compiling():
        return _THROUGH_OP
    return _C.torch_route(tensors)


def _runs_eagerly(*tensors: Optional[Tensor]) -> bool:
    """Whether a call runs the kernel directly (_route)."""
    return _route(*tensors) == _DIRECT


def _autograd_eagerly(*tensors: Optional[Tensor]) -> bool:
    """Whether a call that needs gradients runs through _EagerAttention instead of the op."""
    return _route(*tensors) == _AUTOGRAD


def _call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, generator,
          dropout_state):
    """Returns (out, lse, info): the kernel directly, through _EagerAttention or else
    through the op (_route); info is the op's int64 [seed, offset, backend] tensor, or
    (backend, (seed, offset)) without the op."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor like query, got "
                            f"{type(x).__qualname__} (an array with __dlpack__ for "
                            "non-torch inputs)")
    dropout_p = _convert.number(dropout_p, "dropout_p")
    scale = None if scale is None else _convert.number(scale, "scale")
    mask, spec = _mask_args(attn_mask, query, key)
    # The op's dispatch would take a mix of devices (cpu with meta: uninitialized output).
    for name, x in (("key", key), ("value", value), ("attn_mask", mask)):
        if x is not None and x.device != query.device:
            raise _C.Error(f"{name}: expected device {query.device} (the query device), "
                           f"got {x.device}")
    seed, offset = 0, _DRAW
    generator = _convert.generator(generator)
    dropout_state = _convert.dropout_state(dropout_state)
    if dropout_state is not None:
        seed, offset = _signed(dropout_state[0]), dropout_state[1]
    elif generator is not None and dropout_p > 0:
        s, o = generator.next_state()
        seed, offset = _signed(s), o
    args = (query, key, value, mask, spec, dropout_p, bool(is_causal), scale, bool(enable_gqa),
            seed, offset)
    route = _route(query, key, value, mask)
    if route == _DIRECT:
        out, lse, backend, drawn = _run(*args)
        return out, lse, (backend, drawn)
    if route == _AUTOGRAD:
        info = []
        out, lse = _EagerAttention.apply(*args, info)
        return out, lse, tuple(info)
    return torch.ops.sdpa.attention(*args)


def _stream_context(stream: Any, query: Any):
    """Makes `stream` torch's current stream for a CUDA query's device while a call runs:
    the kernels then run on it through the same path as with stream=None, and autograd
    runs the backward on it (torch replays a forward's stream). A nullcontext for CPU
    queries, which ignore the stream (its type is checked all the same)."""
    handle = None if isinstance(stream, torch.cuda.Stream) else _convert.stream_handle(stream)
    if not (isinstance(query, Tensor) and query.is_cuda):
        return contextlib.nullcontext()
    if handle is not None:
        stream = (torch.cuda.default_stream(query.device) if handle == 0
                  else torch.cuda.ExternalStream(handle, device=query.device))
    elif stream.device != query.device:
        # torch.cuda.stream would switch devices, and the call would ignore the stream.
        raise _C.Error(f"stream: expected a stream of {query.device} (the query device), "
                       f"got one of {stream.device}")
    return torch.cuda.stream(stream)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, *,
                                 generator: Optional["_C.Generator"] = None,
                                 stream: Any = None) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention through the sdpa::attention op
    (differentiable in query, key, value and a float attn_mask). CUDA tensors: runs on
    ``stream`` (torch.cuda.Stream, an object with .cuda_stream or an int cudaStream_t)
    as torch ops run inside ``torch.cuda.stream(stream)``, the backward included; None:
    torch's current stream. Inside torch.nn.attention.sdpa_kernel([...]) (and with
    torch.backends.cuda.enable_*_sdp(False)), only the backends torch leaves enabled run,
    unless an sdpa.sdpa_kernel guard is active."""
    guard = _torch_guard()
    if guard is not None:
        with guard:
            return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                is_causal, scale, enable_gqa,
                                                generator=generator, stream=stream)
    if stream is not None:
        with _stream_context(stream, query):
            return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                is_causal, scale, enable_gqa,
                                                generator=generator)
    if not _compiling():
        # The common eager call (_route _DIRECT, no bias object) in one C++ call; None
        # sends any other call down the general path.
        out = _C.torch_eager_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                       scale, enable_gqa, generator, False)
        if out is not None:
            return out
    return _call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 generator, None)[0]


def scaled_dot_product_attention_with_lse(query: Tensor, key: Tensor, value: Tensor,
                                          attn_mask: Any = None, dropout_p: float = 0.0,
                                          is_causal: bool = False,
                                          scale: Optional[float] = None,
                                          enable_gqa: bool = False, *,
                                          generator: Optional["_C.Generator"] = None,
                                          dropout_state: Optional[tuple] = None,
                                          stream: Any = None):
    """Returns sdpa.AttentionOutput(out, lse, backend, dropout_state); ``out`` is
    differentiable, ``lse`` is not. ``stream`` and torch's guard: as
    scaled_dot_product_attention's."""
    guard = _torch_guard()
    if guard is not None:
        with guard:
            return scaled_dot_product_attention_with_lse(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                generator=generator, dropout_state=dropout_state, stream=stream)
    if stream is not None:
        with _stream_context(stream, query):
            return scaled_dot_product_attention_with_lse(
                query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                generator=generator, dropout_state=dropout_state)
    if dropout_state is None and not _compiling():
        result = _C.torch_eager_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                          scale, enable_gqa, generator, True)
        if result is not None:
            return AttentionOutput._make(result)
    out, lse, info = _call(query, key, value, attn_mask, dropout_p, is_causal, scale,
                           enable_gqa, generator, dropout_state)
    if isinstance(info, Tensor):  # the op's [seed, offset, backend]
        seed, offset, backend = info.tolist()
        info = (_C.SDPBackend(backend), (_unsigned(seed), offset))
    return AttentionOutput(out, lse, *info)


# The contexts of flex calls whose autograd graph is still alive. Their flex_args hold
# sdpa._C objects (the Program); an output still referenced when the interpreter exits
# (a module-level tensor) would keep them alive past the extension's teardown, which
# nanobind reports as leaked instances. The exit hook drops those references first.
_live_flex_contexts: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _drop_flex_programs() -> None:
    for ctx in list(_live_flex_contexts):
        ctx.flex_args = None


class _FlexFunction(torch.autograd.Function):
    """flex_attention with autograd: q, k, v and the captured torch tensors are inputs, so
    gradients reach a learnable bias table; the backward is the library's (symbolic
    d(score_mod)/d(score), deterministic captured-tensor accumulation)."""

    @staticmethod
    def forward(ctx, flex_args, query, key, value, *captured):
        program, block_mask, scale, enable_gqa, names = flex_args
        out, lse, _ = _C.flex_attention(query.detach(), key.detach(), value.detach(), program,
                                        block_mask, scale, enable_gqa,
                                        _convert.stream_handle(None, query))
        out, lse = torch.from_dlpack(out), torch.from_dlpack(lse)
        ctx.flex_args = flex_args
        ctx.backends = _forward_restriction()
        _live_flex_contexts.add(ctx)
        ctx.captured_shapes = [t.shape for t in captured]
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        program, block_mask, scale, enable_gqa, names = ctx.flex_args
        query, key, value, out, lse = ctx.saved_tensors
        with restricted(ctx.backends):
            gq, gk, gv, captured = _C.flex_attention_backward(
                grad_out.contiguous(), query.detach(), key.detach(), value.detach(), out, lse,
                program, block_mask, scale, enable_gqa, _convert.stream_handle(None, query))
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


class _VarlenFunction(torch.autograd.Function):
    """sdpa.attention_varlen with autograd through q, k and v."""

    @staticmethod
    def forward(ctx, lengths, options, dropout_p, query, key, value):
        out, lse, _, state = _C.attention_varlen(query.detach(), key.detach(), value.detach(),
                                                 *lengths, *options, None, dropout_p)
        out, lse = torch.from_dlpack(out), torch.from_dlpack(lse)
        # The backward replays the forward's dropout mask from its state.
        ctx.varlen_args = (lengths, options, dropout_p, state)
        ctx.backends = _forward_restriction()
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        lengths, options, dropout_p, state = ctx.varlen_args
        query, key, value, out, lse = ctx.saved_tensors
        with restricted(ctx.backends):
            gq, gk, gv = _C.attention_varlen_backward(grad_out, query.detach(), key.detach(),
                                                      value.detach(), out, lse, *lengths,
                                                      *options, dropout_p, state)
        return (None, None, None, torch.from_dlpack(gq), torch.from_dlpack(gk),
                torch.from_dlpack(gv))


def _varlen_autograd(query: Tensor, key: Tensor, value: Tensor, lengths: tuple,
                     options: tuple, dropout_p: float = 0.0):
    """(out, lse) of sdpa.attention_varlen for torch tensors, differentiable in query, key
    and value (with dropout_p, the backward replays the forward's mask)."""
    return _VarlenFunction.apply(lengths, options, dropout_p, query, key, value)
