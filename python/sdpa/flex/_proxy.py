"""Traced values: the proxy objects a mod receives, and the operations they support.

Each operation takes Python values (proxies, Python numbers, 0-d arrays) and returns a
``Proxy`` over a node of the C++ expression graph (``sdpa._C.Expr``). Python operators,
torch functions and methods (``_torch_ops``) and numpy ufuncs (``_numpy_ops``) all map
onto ``OPS``, so every spelling of an operation traces to the same program. Nothing here
imports numpy or torch.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

from .. import _C, _convert


class TraceError(TypeError):
    """A mod does something that cannot be recorded into an expression program."""


class _UntraceableAttribute(TraceError, AttributeError):
    """A method a traced value does not have: a TypeError for the user, an
    AttributeError for ``hasattr`` / ``getattr(x, name, default)`` probes."""


def untraceable(op: str, hint: str = "") -> TraceError:
    """The error for an operation that has no expression-program equivalent."""
    return TraceError(f"flex: {op} cannot be traced into a score_mod/mask_mod program"
                      f"{hint or _SUPPORTED}")


_SUPPORTED = (" (supported: arithmetic, comparisons, &, |, ^, ~, <<, >>, where, clamp, "
              "minimum, maximum, abs, exp, exp2, log, log2, tanh, sigmoid, sqrt, sin, cos, "
              "floor, ceil, pow, type conversions, captured tensor reads; see sdpa.flex)")


# ---- values -> expressions --------------------------------------------------------------

def expr(x: Any) -> "_C.Expr":
    """The C++ expression of a proxy or a constant: a Python / numpy number, or a 0-d
    array (a 0-d torch tensor that requires grad is captured, so it gets a gradient).
    Raises TraceError for anything else (a non-scalar array, a string, ...)."""
    if isinstance(x, Proxy):
        return x.expr
    if isinstance(x, bool):
        return _C.expr_bool(x)
    if isinstance(x, numbers.Integral):
        return _C.expr_int(int(x))
    if isinstance(x, numbers.Real):
        return _C.expr_float(float(x))
    if getattr(x, "shape", None) == () and hasattr(x, "item"):  # numpy scalar, 0-d array
        if _convert.is_torch_tensor(x) and x.requires_grad:
            from ._trace import read_scalar_parameter

            return read_scalar_parameter(x).expr
        return expr(x.item())
    raise TraceError(f"flex: cannot use a {type(x).__name__} in a score_mod/mask_mod "
                     "expression (expected a traced value, a number or a 0-d tensor; index "
                     "tensors with traced values to read them)")


def kind(x: Any) -> str:
    """'float', 'int' or 'bool': the value type ``x`` traces to."""
    return expr(x).type


def constant(value: Any, type_: str) -> "_C.Expr":
    """A constant of expression type ``type_`` ('float', 'int', 'bool')."""
    if type_ == "bool":
        return _C.expr_bool(bool(value))
    if type_ == "int":
        if float(value) != int(value):
            raise TraceError(f"flex: {value!r} is not an integer constant")
        return _C.expr_int(int(value))
    return _C.expr_float(float(value))


def convert(x: Any, type_: str) -> "Proxy":
    """``x`` as ``type_`` (torch's ``.to(dtype)`` on a traced value): bool and int widen
    exactly; float -> int (truncation) is not traceable."""
    e = expr(x)
    if e.type == type_:
        return Proxy(e)
    if type_ == "float":
        return Proxy(_C.to_float(e))
    if type_ == "bool":
        return Proxy(_C.ne(e, constant(0, e.type)))
    if e.type == "bool":  # bool -> int
        return Proxy(_C.where(e, _C.expr_int(1), _C.expr_int(0)))
    raise untraceable("converting a float to an integer type",
                      " (truncation is not an expression-program operation)")


# ---- operations -------------------------------------------------------------------------

def _c_binary(name: str) -> Callable[[Any, Any], "Proxy"]:
    fn = getattr(_C, name)
    return lambda a, b: Proxy(fn(expr(a), expr(b)))


def _c_unary(name: str) -> Callable[[Any], "Proxy"]:
    fn = getattr(_C, name)
    return lambda a: Proxy(fn(expr(a)))


_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


def _constant_value(x: Any) -> Any:
    """The Python number ``x`` stands for, or None when ``x`` is traced (a proxy, or a 0-d
    torch tensor that requires grad and so is captured)."""
    if isinstance(x, Proxy) or (_convert.is_torch_tensor(x) and x.requires_grad):
        return None
    if isinstance(x, numbers.Number):
        return x
    if getattr(x, "shape", None) == () and hasattr(x, "item"):
        return x.item()
    return None


def _pow(a: Any, b: Any) -> "Proxy":
    """a ** b. A constant integer exponent multiplies (exact for integers, as torch);
    0.5 is sqrt; otherwise exp(b * log(a)), which needs a > 0."""
    exponent = _constant_value(b)
    if exponent is not None and not isinstance(exponent, bool):
        exponent = float(exponent)
        if exponent.is_integer() and abs(exponent) <= 64:
            n = int(abs(exponent))
            base = expr(a)
            result, power = constant(1, "int" if base.type == "int" else "float"), base
            while n:  # square-and-multiply
                if n & 1:
                    result = _C.mul(result, power)
                n >>= 1
                if n:
                    power = _C.mul(power, power)
            return Proxy(_C.truediv(_C.expr_float(1.0), result) if exponent < 0 else result)
        if exponent == 0.5:
            return Proxy(_C.sqrt(expr(a)))
    base = _constant_value(a)
    if base is not None:  # c ** traced: exp(b * ln c)
        if not float(base) > 0:
            raise untraceable(f"{base} ** (traced exponent)", " (needs a positive base)")
        return Proxy(_C.exp(_C.mul(expr(b), _C.expr_float(math.log(float(base))))))
    return Proxy(_C.exp(_C.mul(expr(b), _C.log(expr(a)))))


def _clamp(x: Any, min: Any = None, max: Any = None) -> "Proxy":  # noqa: A002 (torch's names)
    e = expr(x)
    if min is not None:
        e = _C.maximum(e, expr(min))
    if max is not None:
        e = _C.minimum(e, expr(max))
    return Proxy(e)


def _where(cond: Any, a: Any, b: Any) -> "Proxy":
    return Proxy(_C.where(expr(cond), expr(a), expr(b)))


#: Every traceable operation by name; operands are traced values or constants.
OPS: dict[str, Callable[..., "Proxy"]] = {
    **{n: _c_binary(n) for n in ("add", "sub", "mul", "truediv", "mod", "floordiv", "lt", "le",
                                 "gt", "ge", "eq", "ne", "and_", "or_", "xor", "lshift",
                                 "rshift", "minimum", "maximum")},
    **{n: _c_unary(n) for n in ("neg", "not_", "abs", "exp", "log", "tanh", "sigmoid", "sqrt",
                                "sin", "cos", "floor", "ceil")},
    "pow": _pow,
    "where": _where,
    "clamp": _clamp,
    "positive": lambda a: Proxy(expr(a)),
    "exp2": lambda a: Proxy(_C.exp(_C.mul(expr(a), _C.expr_float(_LN2)))),
    "log2": lambda a: Proxy(_C.truediv(_C.log(expr(a)), _C.expr_float(_LN2))),
    "log10": lambda a: Proxy(_C.truediv(_C.log(expr(a)), _C.expr_float(_LN10))),
    "square": lambda a: Proxy(_C.mul(expr(a), expr(a))),
    "reciprocal": lambda a: Proxy(_C.truediv(_C.expr_float(1.0), expr(a))),
    "rsqrt": lambda a: Proxy(_C.truediv(_C.expr_float(1.0), _C.sqrt(expr(a)))),
    "relu": lambda a: Proxy(_C.maximum(expr(a), constant(0, kind(a)))),
}


# ---- the proxy ----------------------------------------------------------------------------

def _binary(name: str, reflected: bool = False):
    op = OPS[name]
    if reflected:
        return lambda self, other: op(other, self)
    return lambda self, other: op(self, other)


def _unary(name: str):
    op = OPS[name]
    return lambda self: op(self)


class Proxy:
    """A traced value inside a mod: score, b, h, q_idx, kv_idx and what is computed from
    them. Supports Python operators, ``__torch_function__`` (torch functions), numpy
    ufuncs and the torch.Tensor methods listed in ``_torch_ops``; Python control flow on
    it raises TraceError."""

    __slots__ = ("expr",)

    def __init__(self, e: "_C.Expr"):
        self.expr = e

    # Read by mods that build constants like the value (torch.full_like(score, x),
    # torch.tensor(x, dtype=score.dtype)): a traced value is a CPU scalar.
    @property
    def dtype(self) -> Any:
        from ._methods import framework_dtype

        return framework_dtype(self.expr.type)

    shape = ()
    ndim = 0

    @property
    def device(self) -> Any:
        import sys

        torch = sys.modules.get("torch")
        return torch.device("cpu") if torch is not None else "cpu"

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("truediv"), _binary("truediv", True)
    __floordiv__, __rfloordiv__ = _binary("floordiv"), _binary("floordiv", True)
    __mod__, __rmod__ = _binary("mod"), _binary("mod", True)
    __pow__, __rpow__ = _binary("pow"), _binary("pow", True)
    __lt__, __le__ = _binary("lt"), _binary("le")
    __gt__, __ge__ = _binary("gt"), _binary("ge")
    __eq__, __ne__ = _binary("eq"), _binary("ne")  # type: ignore[assignment]
    __and__, __rand__ = _binary("and_"), _binary("and_", True)
    __or__, __ror__ = _binary("or_"), _binary("or_", True)
    __xor__, __rxor__ = _binary("xor"), _binary("xor", True)
    __lshift__, __rlshift__ = _binary("lshift"), _binary("lshift", True)
    __rshift__, __rrshift__ = _binary("rshift"), _binary("rshift", True)
    # math.floor / math.ceil of a traced value: a float value, as torch's Tensor.__floor__.
    __floor__, __ceil__ = _unary("floor"), _unary("ceil")
    __neg__, __pos__ = _unary("neg"), _unary("positive")
    __invert__, __abs__ = _unary("not_"), _unary("abs")
    __hash__ = None  # type: ignore[assignment]

    def __getattr__(self, name: str) -> Any:
        # Methods (score.tanh(), q_idx.float(), b.new_ones(())...) come from one table
        # shared with torch.Tensor's methods under __torch_function__.
        from ._methods import METHODS

        method = METHODS.get(name)
        if method is not None:
            return lambda *args, **kwargs: method(self, *args, **kwargs)
        if name.startswith("_"):
            raise AttributeError(name)
        raise _UntraceableAttribute(str(untraceable(f"Tensor.{name}")))

    def __bool__(self):
        raise TraceError("flex: a score_mod/mask_mod cannot branch on a traced value "
                         "(Python `if`, `and`, `or`, `min`/`max` of expressions); use "
                         "torch.where / & / | / torch.minimum instead")

    def __float__(self):
        raise TraceError("flex: a traced value has no Python number (float(), math.* "
                         "functions); use torch functions or operators on it")

    __int__ = __complex__ = __float__

    def __index__(self):
        raise TraceError("flex: a traced value cannot index a Python list or a numpy/jax "
                         "array directly; index torch tensors, arrays captured from the "
                         "mod's closure or globals, or wrap the array with "
                         "sdpa.flex.capture(array)")

    def __len__(self):
        raise TraceError("flex: a traced value is a scalar: it has no len() and cannot be "
                         "iterated")

    __iter__ = __len__

    def __repr__(self) -> str:
        return f"<flex traced {self.expr.type}>"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from ._torch_ops import call

        return call(func, args, kwargs or {})

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from ._numpy_ops import call_ufunc

        return call_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from ._numpy_ops import call_function

        return call_function(func, args, kwargs)
