"""Conversions between the caller's arrays and sdpa._C, zero-copy through DLPack.

Inputs: anything with ``__dlpack__`` (numpy, torch, jax, cupy, ...), an ``sdpa.Tensor`` or
a raw DLPack capsule. Outputs: the caller's framework type, chosen from the query.
This module never imports numpy or torch itself; it uses them only when the caller's
objects come from them.
"""

from __future__ import annotations

import operator
import sys
from typing import Any

from . import _C

_DLPACK_VERSION = (1, 0)
_DL_CUDA = 2  # DLPack's kDLCUDA device type


def is_torch_tensor(obj: Any) -> bool:
    """True for a torch.Tensor, without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _type_name(obj: Any) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def number(value: Any, arg: str) -> float:
    """float(value) for a real number (int, float, numpy or torch scalar); TypeError naming
    `arg` for anything else. A string is not a number here, as in torch's
    scaled_dot_product_attention (float("0.1") would take it)."""
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"{arg}: expected a number, got {_type_name(value)} {value!r}")


def generator(gen: Any) -> Any:
    """`gen` when None or an sdpa.Generator; TypeError naming the argument otherwise."""
    if gen is None or isinstance(gen, _C.Generator):
        return gen
    raise TypeError(f"generator: expected an sdpa.Generator or None, got {_type_name(gen)}")


def dropout_state(state: Any) -> Any:
    """(seed, offset) as two unsigned 64-bit ints, or None; TypeError / sdpa.Error naming
    the argument otherwise (a replayed forward's AttentionOutput.dropout_state)."""
    if state is None:
        return None
    try:
        seed, offset = state
        seed, offset = operator.index(seed), operator.index(offset)
    except (TypeError, ValueError):
        raise TypeError("dropout_state: expected a (seed, offset) pair of integers, got "
                        f"{state!r}") from None
    if not (0 <= seed < 2**64 and 0 <= offset < 2**64):
        raise _C.Error("dropout_state: expected seed and offset in [0, 2^64), got "
                       f"({seed}, {offset})")
    return seed, offset


def dropout_position(position: Any) -> Any:
    """(q_offset, kv_offset, q_len, kv_len) as four ints, or None; TypeError naming the
    argument otherwise (the C++ call checks the values)."""
    if position is None:
        return None
    try:
        values = tuple(operator.index(x) for x in position)
    except TypeError:
        values = ()
    if len(values) != 4:
        raise TypeError("dropout_position: expected (q_offset, kv_offset, q_len, kv_len) as "
                        f"four integers, got {position!r}")
    return values


def stream_handle(stream: Any, query: Any = None) -> int:
    """The cudaStream_t (an int; 0 the legacy default stream) a call on `query` runs on:
    `stream` as an int handle or an object with ``.cuda_stream`` (torch.cuda.Stream,
    cupy's streams); for None, torch's current stream of a torch CUDA query's device (as
    torch's own ops use), else 0. TypeError naming the argument for anything else."""
    if stream is None:
        if is_torch_tensor(query) and query.is_cuda:
            return sys.modules["torch"].cuda.current_stream(query.device).cuda_stream
        return 0
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
        raise TypeError("stream: expected None, a cudaStream_t handle (an int >= 0) or an "
                        f"object with .cuda_stream, got {_type_name(stream)} {stream!r}")
    return handle


def to_capsule(obj: Any, arg: str = "tensor", stream: int = 0) -> Any:
    """Returns a DLPack capsule (or an sdpa.Tensor) for `obj`; raises TypeError naming
    `arg` for objects that are not arrays. `stream` is the cudaStream_t the caller reads a
    CUDA array on: its producer is asked to make its writes visible there (DLPack's
    stream argument). 0, the legacy default stream, is what a producer assumes when it
    is not told, so only other streams are passed (and only to CUDA arrays: a CPU
    producer accepts no stream)."""
    if isinstance(obj, _C.Tensor) or type(obj).__name__ == "PyCapsule":
        return obj
    if getattr(type(obj), "__dlpack__", None) is None:
        raise TypeError(
            f"{arg}: expected an array with __dlpack__ (numpy, torch, jax, ...), "
            f"got {_type_name(obj)}")
    kwargs = {}
    if is_torch_tensor(obj):
        if obj.requires_grad:
            # torch refuses to export tensors that require grad; sdpa only reads them.
            obj = obj.detach()
        if obj.is_cuda:
            # torch's producer skips synchronization unless told the stream (its default
            # is -1); 1 is DLPack's name for the legacy default stream.
            kwargs["stream"] = stream or 1
    elif stream and obj.__dlpack_device__()[0] == _DL_CUDA:
        kwargs["stream"] = stream
    try:
        # DLPack 1.0 first: it can carry read-only arrays (numpy refuses those otherwise).
        return obj.__dlpack__(max_version=_DLPACK_VERSION, **kwargs)
    except TypeError:
        pass  # A producer that predates max_version.
    except BufferError as e:
        raise TypeError(f"{arg}: cannot be exported through DLPack: {e}") from e
    try:
        return obj.__dlpack__(**kwargs)
    except BufferError as e:
        raise TypeError(f"{arg}: cannot be exported through DLPack: {e}") from e


def like(tensor: "_C.Tensor", reference: Any) -> Any:
    """Returns `tensor` as the framework type of `reference`, sharing memory."""
    if is_torch_tensor(reference):
        return sys.modules["torch"].from_dlpack(tensor)
    module = type(reference).__module__.split(".", 1)[0]
    if module == "numpy":
        return sys.modules["numpy"].from_dlpack(tensor)
    namespace = getattr(reference, "__array_namespace__", None)
    if namespace is not None:  # jax.numpy, cupy, array-api-strict, ...
        return namespace().from_dlpack(tensor)
    if isinstance(reference, _C.Tensor) or type(reference).__name__ == "PyCapsule":
        return tensor
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        return numpy.from_dlpack(tensor)
    return tensor


def dtype_name(dtype: Any) -> tuple[str, bool]:
    """Returns (sdpa dtype name, True if `dtype` is a torch.dtype) for a str, a numpy
    dtype or a torch.dtype."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype).removeprefix("torch."), True
    if isinstance(dtype, str):
        return dtype, False
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None)
    if name is None:
        raise TypeError(f"dtype: expected a str, numpy dtype or torch.dtype, got {dtype!r}")
    return str(name), False


def from_sdpa(tensor: "_C.Tensor", want_torch: bool) -> Any:
    """numpy array (or torch tensor when asked, or for bfloat16) sharing `tensor`."""
    if want_torch or tensor.dtype == "bfloat16":
        import torch

        return torch.from_dlpack(tensor)
    import numpy

    return numpy.from_dlpack(tensor)
