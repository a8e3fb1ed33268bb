"""Automatic capture of non-torch arrays a mod reads from its closure or module globals.

numpy and jax arrays cannot be indexed by a proxy (numpy asks for ``__index__`` before
anything else, and nothing says which array asked), so before tracing, a mod is copied
with those arrays replaced by ``sdpa.flex.capture`` wrappers named after their variables.
torch tensors need no wrapping: their indexing reaches ``__torch_function__``.
"""

from __future__ import annotations

import types
from typing import Any, Callable

from .. import _convert

_MAX_DEPTH = 8  # nested helper functions followed (mods calling mods calling helpers)


def _is_array(value: Any) -> bool:
    return (not _convert.is_torch_tensor(value) and hasattr(type(value), "__dlpack__")
            and getattr(value, "ndim", 0) >= 1)


def _global_names(code: types.CodeType) -> set:
    """Names the code (and functions defined inside it) may read from its globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


class _Rewriter:
    def __init__(self, wrap: Callable[[Any, str], Any]):
        self.wrap = wrap
        self.done: dict[int, Any] = {}

    def value(self, value: Any, name: str, depth: int) -> Any:
        """``value`` with arrays wrapped and functions rewritten (the same object when
        nothing inside needs it)."""
        if _is_array(value):
            return self.wrap(value, name)
        if isinstance(value, types.FunctionType):
            return self.function(value, depth + 1)
        if isinstance(value, (tuple, list)) and any(
                isinstance(v, types.FunctionType) or _is_array(v) for v in value):
            items = [self.value(v, f"{name}[{i}]", depth) for i, v in enumerate(value)]
            if all(a is b for a, b in zip(items, value)):
                return value
            return type(value)(items)
        return value

    def function(self, fn: types.FunctionType, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH or id(fn) in self.done:
            return self.done.get(id(fn), fn)
        self.done[id(fn)] = fn  # recursion guard: a function reaching itself stays as is
        code = fn.__code__
        cells = fn.__closure__ or ()
        new_cells, changed = [], False
        for name, cell in zip(code.co_freevars, cells):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell (a variable not yet assigned)
                new_cells.append(cell)
                continue
            new = self.value(contents, name, depth)
            changed |= new is not contents
            new_cells.append(types.CellType(new) if new is not contents else cell)
        replaced = {}
        for name in _global_names(code):
            if name in fn.__globals__:
                old = fn.__globals__[name]
                new = self.value(old, name, depth)
                if new is not old:
                    replaced[name] = new
        if not changed and not replaced:
            return fn
        # A shallow copy of the module's globals: the mod sees the wrappers, the module
        # keeps its arrays.
        scope = {**fn.__globals__, **replaced} if replaced else fn.__globals__
        copy = types.FunctionType(code, scope, fn.__name__, fn.__defaults__, tuple(new_cells))
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__ = fn.__qualname__
        self.done[id(fn)] = copy
        return copy


def with_arrays_captured(mod: Callable, wrap: Callable[..., Any]) -> Callable:
    """``mod``, or a copy whose closure and globals hold ``wrap(array, name)`` in place of
    each non-torch array (followed into functions, and tuples or lists of functions, it
    references, such as the mods of and_masks). Callables other than plain functions
    (methods, partials, objects) are returned as they are."""
    if not isinstance(mod, types.FunctionType):
        return mod
    return _Rewriter(lambda array, name: wrap(array, name)).function(mod)
