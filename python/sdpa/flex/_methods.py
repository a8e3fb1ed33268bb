"""torch.Tensor methods on traced values (``score.tanh()``, ``q_idx.float()``,
``b.new_ones((), dtype=torch.bool)``), by name. The same table serves methods looked up
on a proxy and ``torch.Tensor.<name>`` calls routed through ``__torch_function__``."""

from __future__ import annotations

import sys
from typing import Any, Callable

from ._proxy import OPS, Proxy, TraceError, constant, convert, expr, untraceable


def dtype_kind(dtype: Any) -> str:
    """The expression type ('float', 'int', 'bool') of a torch dtype, numpy dtype, Python
    type or type name. Raises TraceError for others (complex, strings)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype == torch.bool:
            return "bool"
        if dtype.is_floating_point:
            return "float"
        if not dtype.is_complex:
            return "int"
    elif dtype in (bool, int, float):
        return dtype.__name__
    elif dtype in ("float", "int", "bool"):
        return dtype
    else:
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            try:
                code = numpy.dtype(dtype).kind
            except TypeError:
                code = None
            kinds = {"b": "bool", "i": "int", "u": "int", "f": "float"}
            if code in kinds:
                return kinds[code]
    raise TraceError(f"flex: dtype {dtype!r} has no expression type (float, int or bool)")


def framework_dtype(type_: str) -> Any:
    """What ``proxy.dtype`` reports: the torch dtype torch's own FlexAttention gives such
    values (float32 scores, int32 indices, bool), a numpy dtype without torch, or the
    expression type name without either."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return {"float": torch.float32, "int": torch.int32, "bool": torch.bool}[type_]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        return numpy.dtype({"float": "float32", "int": "int32", "bool": "bool"}[type_])
    return type_


def _to(self: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> Proxy:
    """Tensor.to(dtype) / .to(device, dtype) / .to(other): only the dtype matters."""
    for a in args:
        if isinstance(a, Proxy):
            dtype = a.dtype
        elif not isinstance(a, str) and type(a).__name__ != "device":
            dtype = a
    return convert(self, expr(self).type if dtype is None else dtype_kind(dtype))


def _new_full(self: Any, size: Any, fill_value: Any, *, dtype: Any = None, **_: Any) -> Proxy:
    """Tensor.new_full(size, value): a constant (a traced value is a scalar, so only
    () or [] sizes, which torch's and_masks / or_masks / noop_mask use)."""
    if tuple(size) not in ((), (1,)):
        raise TraceError(f"flex: new tensors in a mod must be scalars, got size {tuple(size)}")
    return Proxy(constant(fill_value, expr(self).type if dtype is None else dtype_kind(dtype)))


def _full_like(self: Any, fill_value: Any, *, dtype: Any = None, **_: Any) -> Proxy:
    return _new_full(self, (), fill_value, dtype=dtype)


def _new_tensor(self: Any, data: Any, *, dtype: Any = None, **_: Any) -> Proxy:
    if isinstance(data, Proxy):
        return convert(data, dtype_kind(dtype)) if dtype is not None else data
    value = data.item() if hasattr(data, "item") else data
    if dtype is None:
        dtype = type(value) if isinstance(value, (bool, int, float)) else expr(self).type
    return Proxy(constant(value, dtype_kind(dtype)))


def _minmax(name: str) -> Callable[..., Proxy]:
    def method(self: Any, other: Any = None, *args: Any, **kwargs: Any) -> Proxy:
        # torch.max(x) and torch.max(x, dim) are reductions, not the elementwise form.
        if other is None or args or kwargs or type(other) is int:
            raise untraceable(f"Tensor.{name} as a reduction",
                              f" (only the elementwise torch.{name}(a, b) form)")
        return OPS["minimum" if name == "min" else "maximum"](self, other)
    return method


def _div(self: Any, other: Any, *, rounding_mode: Any = None) -> Proxy:
    if rounding_mode is None:
        return OPS["truediv"](self, other)
    if rounding_mode == "floor":
        return OPS["floordiv"](self, other)
    raise untraceable(f"division with rounding_mode={rounding_mode!r}",
                      " (only None and 'floor')")


def _add(self: Any, other: Any, *, alpha: Any = 1) -> Proxy:
    return OPS["add"](self, other if alpha == 1 else OPS["mul"](other, alpha))


def _sub(self: Any, other: Any, *, alpha: Any = 1) -> Proxy:
    return OPS["sub"](self, other if alpha == 1 else OPS["mul"](other, alpha))


def _where_method(self: Any, condition: Any, other: Any) -> Proxy:
    """Tensor.where(condition, other) = torch.where(condition, self, other)."""
    return OPS["where"](condition, self, other)


def _clamp_method(self: Any, min: Any = None, max: Any = None) -> Proxy:  # noqa: A002
    return OPS["clamp"](self, min, max)


def _size(self: Any, dim: Any = None) -> tuple:
    if dim is not None:
        raise TraceError("flex: a traced value is a scalar: it has no dimension to size")
    return ()


def _op(name: str) -> Callable[..., Proxy]:
    op = OPS[name]
    return lambda self, *args: op(self, *args)


_TYPE_METHODS = {"float": "float", "double": "float", "half": "float", "bfloat16": "float",
                 "int": "int", "long": "int", "short": "int", "bool": "bool"}

#: Method name -> implementation taking the traced value first (torch's semantics).
METHODS: dict[str, Callable[..., Proxy]] = {
    **{name: _op(op) for name, op in (
        ("exp", "exp"), ("exp2", "exp2"), ("log", "log"), ("log2", "log2"),
        ("log10", "log10"), ("tanh", "tanh"), ("sigmoid", "sigmoid"), ("sqrt", "sqrt"),
        ("rsqrt", "rsqrt"), ("abs", "abs"), ("absolute", "abs"), ("neg", "neg"),
        ("negative", "neg"), ("positive", "positive"), ("square", "square"),
        ("reciprocal", "reciprocal"), ("relu", "relu"), ("logical_not", "not_"),
        ("bitwise_not", "not_"), ("minimum", "minimum"), ("maximum", "maximum"),
        ("fmin", "minimum"), ("fmax", "maximum"), ("mul", "mul"), ("multiply", "mul"),
        ("true_divide", "truediv"), ("floor_divide", "floordiv"), ("remainder", "mod"),
        ("pow", "pow"), ("float_power", "pow"), ("eq", "eq"), ("ne", "ne"),
        ("not_equal", "ne"), ("lt", "lt"), ("less", "lt"), ("le", "le"),
        ("less_equal", "le"), ("gt", "gt"), ("greater", "gt"), ("ge", "ge"),
        ("greater_equal", "ge"), ("logical_and", "and_"), ("logical_or", "or_"),
        ("logical_xor", "xor"), ("bitwise_and", "and_"), ("bitwise_or", "or_"),
        ("bitwise_xor", "xor"), ("bitwise_left_shift", "lshift"),
        ("bitwise_right_shift", "rshift"), ("sin", "sin"), ("cos", "cos"), ("floor", "floor"),
        ("ceil", "ceil"))},
    **{name: (lambda t: lambda self: convert(self, t))(t) for name, t in _TYPE_METHODS.items()},
    "to": _to,
    "type_as": lambda self, other: convert(self, expr(other).type),
    "add": _add,
    "sub": _sub,
    "subtract": _sub,
    "div": _div,
    "divide": _div,
    "clamp": _clamp_method,
    "clip": _clamp_method,
    "clamp_min": lambda self, min: OPS["clamp"](self, min, None),  # noqa: A002
    "clamp_max": lambda self, max: OPS["clamp"](self, None, max),  # noqa: A002
    "min": _minmax("min"),
    "max": _minmax("max"),
    "where": _where_method,
    "new_full": _new_full,
    "new_ones": lambda self, size=(), **kw: _new_full(self, size, 1, **kw),
    "new_zeros": lambda self, size=(), **kw: _new_full(self, size, 0, **kw),
    "new_tensor": _new_tensor,
    "full_like": _full_like,
    "ones_like": lambda self, **kw: _full_like(self, 1, **kw),
    "zeros_like": lambda self, **kw: _full_like(self, 0, **kw),
    "dim": lambda self: 0,
    "size": _size,
    "contiguous": lambda self, *a, **k: self,
    "clone": lambda self, *a, **k: self,
    "detach": lambda self: self,
}
