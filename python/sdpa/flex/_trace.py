"""Tracing a mod: the tensors it captures and the reads it makes of them.

``trace(mod, is_mask)`` calls the mod once with proxies for (score,) b, h, q_idx, kv_idx
inside a ``Trace`` that records each captured tensor once (by identity) under a unique
name; the names map gradients back to the tensors after the backward.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Optional

from .. import _C, _convert
from ._closure import with_arrays_captured
from ._proxy import Proxy, TraceError, expr


_local = threading.local()  # the trace in progress, per thread (mods may trace concurrently)


class Trace:
    """The tensors captured while tracing one mod, in capture order."""

    @staticmethod
    def active() -> Optional["Trace"]:
        return getattr(_local, "trace", None)

    def __init__(self) -> None:
        self.by_id: dict[int, "_C.Captured"] = {}
        self.sources: dict[str, Any] = {}  # captured name -> the array the mod read
        self.keep: list[Any] = []  # keeps captured objects alive, so ids stay unique
        self.counter = itertools.count()

    def capture(self, array: Any, name: Optional[str], requires_grad: bool) -> "_C.Captured":
        key = id(array)
        if key not in self.by_id:
            source = array
            if _convert.is_torch_tensor(array):
                source = array.detach()
                if source.dim() == 0:  # programs read tensors of >= 1 dimension
                    source = source.reshape(1)
            label = name or f"captured{next(self.counter)}"
            while label in self.sources:  # names map gradients back: keep them unique
                label = f"{label}_{next(self.counter)}"
            self.by_id[key] = _C.Captured(label, source, requires_grad)
            self.sources[label] = array
            self.keep.append(array)
        return self.by_id[key]


def _active(what: str) -> Trace:
    trace = Trace.active()
    if trace is None:
        raise TraceError(f"flex: {what} only inside a score_mod/mask_mod being traced")
    return trace


class _PartialRead:
    """A captured tensor indexed in fewer dimensions than it has: t[h] of a 2-D t."""

    __slots__ = ("captured", "indices")

    def __init__(self, captured: "_C.Captured", indices: list):
        self.captured, self.indices = captured, indices

    def __getitem__(self, index: Any) -> Any:
        return read(self.captured, self.indices, index)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TraceError(f"flex: '{self.captured.name}' has {self.captured.ndim} dimensions "
                         f"and is indexed with {len(self.indices)}: index every dimension "
                         "before computing with it")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _refuse
    __rtruediv__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _refuse
    __and__ = __rand__ = __or__ = __ror__ = __neg__ = __bool__ = _refuse
    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in args:
            if isinstance(a, _PartialRead):
                a._refuse()
        raise TraceError("flex: a partially indexed captured tensor")


def read(captured: "_C.Captured", done: list, index: Any) -> Any:
    """``captured[*done, *index]``: a Proxy once every dimension is indexed."""
    more = list(index) if isinstance(index, tuple) else [index]
    for i in more:
        if isinstance(i, (slice, type(Ellipsis))) or i is None:
            raise TraceError(f"flex: '{captured.name}' indexed with {i!r}: a mod reads one "
                             "element, so index every dimension with an integer or a traced "
                             "integer")
    indices = done + [expr(i) for i in more]
    if len(indices) > captured.ndim:
        raise TraceError(f"flex: '{captured.name}' has {captured.ndim} dimensions, indexed "
                         f"with {len(indices)}")
    if len(indices) < captured.ndim:
        return _PartialRead(captured, indices)
    return Proxy(captured.read(indices))


def _has_traced(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, (Proxy, _PartialRead)) for i in items)


def torch_getitem(tensor: Any, index: Any) -> Any:
    """torch.Tensor.__getitem__ with a traced index: a read of the captured tensor (its
    gradient flows back when it requires grad)."""
    trace = _active("indexing a tensor with a traced value")
    return read(trace.capture(tensor, None, bool(tensor.requires_grad)), [], index)


def read_scalar_parameter(tensor: Any) -> Proxy:
    """A 0-d torch tensor that requires grad, used as a number in a mod: captured (as one
    element), so it receives a gradient like a table does."""
    trace = _active("a 0-d tensor that requires grad is usable")
    return Proxy(trace.capture(tensor, None, True).read([_C.expr_int(0)]))


class capture:  # noqa: N801 (a function-like wrapper, named as torch's helpers are)
    """Marks an array (numpy, jax, sdpa.Tensor, torch...) as a tensor a mod reads with
    traced indices: ``table = sdpa.flex.capture(np_table, "table"); ... table[h, q_idx -
    kv_idx]``. Arrays in the mod's closure or module globals are captured this way
    automatically; wrap the others (attributes of objects, arrays made inside the mod).
    ``requires_grad`` (float arrays): flex_attention_backward returns its gradient.
    Indexing with plain integers, len() and attributes (shape, dtype, ...) reach the
    array itself."""

    def __init__(self, array: Any, name: Optional[str] = None, requires_grad: bool = False):
        self.array, self.name, self.requires_grad = array, name, requires_grad

    def __getitem__(self, index: Any) -> Any:
        if not _has_traced(index):
            return self.array[index]
        trace = _active("a captured array is readable with traced indices")
        return read(trace.capture(self.array, self.name, self.requires_grad), [], index)

    def __len__(self) -> int:
        return len(self.array)

    def __getattr__(self, name: str) -> Any:
        if name in ("array", "name", "requires_grad"):
            raise AttributeError(name)
        return getattr(self.array, name)

    def __repr__(self) -> str:
        return f"sdpa.flex.capture({self.array!r}, name={self.name!r})"


def trace(mod: Callable, is_mask: bool) -> tuple["_C.Program", dict]:
    """Traces ``mod`` into a program; returns (program, {captured name: array}).
    Raises TraceError for untraceable mods and sdpa.Error for type errors (a mask_mod
    returning a number, bool arithmetic, ...)."""
    if not callable(mod):
        raise TypeError(f"flex: expected a callable {'mask_mod' if is_mask else 'score_mod'}, "
                        f"got {type(mod).__name__}")
    traced_mod = with_arrays_captured(mod, capture)
    state = Trace()

    def run(*placeholders: "_C.Expr") -> "_C.Expr":
        outer, _local.trace = Trace.active(), state
        try:
            result = traced_mod(*(Proxy(p) for p in placeholders))
        except IndexError as e:  # numpy refuses a proxy inside [] without asking it
            raise TraceError(f"flex: could not index an array with a traced value ({e}); "
                             "index torch tensors, arrays in the mod's closure or globals, "
                             "or wrap the array with sdpa.flex.capture(array)") from e
        finally:
            _local.trace = outer
        return expr(result)

    program = _C.Program.from_mask_mod(run) if is_mask else _C.Program.from_score_mod(run)
    return program, state.sources
