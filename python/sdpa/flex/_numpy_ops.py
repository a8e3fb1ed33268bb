"""numpy on traced values: ufuncs through ``Proxy.__array_ufunc__`` (np.tanh(score),
np.maximum(a, b), an ndarray operand on the left) and np.where / np.clip through
``__array_function__``, so numpy-only mods trace as torch ones do."""

from __future__ import annotations

from typing import Any

from ._proxy import OPS, untraceable

# ufunc __name__ -> OPS name.
_UFUNCS = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "truediv",
    "true_divide": "truediv", "floor_divide": "floordiv", "remainder": "mod", "mod": "mod",
    "power": "pow", "float_power": "pow", "negative": "neg", "positive": "positive",
    "absolute": "abs", "fabs": "abs", "exp": "exp", "exp2": "exp2", "log": "log",
    "log2": "log2", "log10": "log10", "sqrt": "sqrt", "square": "square",
    "reciprocal": "reciprocal", "tanh": "tanh", "minimum": "minimum", "maximum": "maximum",
    "fmin": "minimum", "fmax": "maximum", "less": "lt", "less_equal": "le", "greater": "gt",
    "greater_equal": "ge", "equal": "eq", "not_equal": "ne", "logical_and": "and_",
    "logical_or": "or_", "logical_xor": "xor", "logical_not": "not_", "bitwise_and": "and_",
    "bitwise_or": "or_", "bitwise_xor": "xor", "invert": "not_", "left_shift": "lshift",
    "right_shift": "rshift", "sin": "sin", "cos": "cos", "floor": "floor", "ceil": "ceil",
}


def call_ufunc(ufunc: Any, method: str, inputs: tuple, kwargs: dict) -> Any:
    """The traced result of ``ufunc(*inputs)``; raises TraceError for ufuncs without an
    equivalent, for ``out=``/``where=`` and for methods such as ``reduce``."""
    name = getattr(ufunc, "__name__", repr(ufunc))
    op = _UFUNCS.get(name)
    if op is None or method != "__call__" or kwargs:
        detail = f"np.{name}" + ("" if method == "__call__" else f".{method}")
        raise untraceable(detail + (f" with {', '.join(kwargs)}=" if kwargs else ""))
    return OPS[op](*inputs)


def _where(condition: Any, x: Any = None, y: Any = None) -> Any:
    if x is None or y is None:
        raise untraceable("np.where(condition)", " (only the 3-argument form)")
    return OPS["where"](condition, x, y)


def _clip(a: Any, a_min: Any = None, a_max: Any = None, *, min: Any = None,  # noqa: A002
          max: Any = None, **kwargs: Any) -> Any:  # noqa: A002 (numpy's names)
    if kwargs:
        raise untraceable(f"np.clip with {', '.join(kwargs)}=")
    return OPS["clamp"](a, a_min if min is None else min, a_max if max is None else max)


def call_function(func: Any, args: tuple, kwargs: dict) -> Any:
    """np.where / np.clip on traced values; TraceError naming any other numpy function."""
    handler = {"where": _where, "clip": _clip}.get(getattr(func, "__name__", ""))
    if handler is None or getattr(func, "__module__", "").split(".")[0] != "numpy":
        raise untraceable(f"np.{getattr(func, '__name__', func)}")
    return handler(*args, **kwargs)
