"""torch functions on traced values, through ``Proxy.__torch_function__``: torch.where,
torch.tanh, torch.exp2, ..., torch.Tensor methods called as functions, operators with a
torch tensor on the left (``slopes[h] * 2`` is a proxy already; ``alpha * q_idx`` with a
0-d tensor alpha lands here) and reads of captured tensors (``table[h, q_idx]``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ._methods import METHODS
from ._proxy import OPS, untraceable

# Binary operator dunders of torch.Tensor -> OPS name; the reflected form swaps operands.
_DUNDERS = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "truediv", "div": "truediv",
            "floordiv": "floordiv", "mod": "mod", "pow": "pow", "and": "and_", "or": "or_",
            "xor": "xor", "lshift": "lshift", "rshift": "rshift", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq",
            "ne": "ne"}


def _table() -> dict:
    import torch

    from ._trace import torch_getitem

    table: dict[Any, Callable] = {}
    for name, method in METHODS.items():
        function = getattr(torch, name, None)
        if callable(function) and not isinstance(function, torch.dtype):
            table[function] = method
        for cls in (torch.Tensor, torch._C.TensorBase):
            if hasattr(cls, name):
                table[getattr(cls, name)] = method
    table[torch.where] = OPS["where"]  # torch.where(cond, a, b), unlike Tensor.where
    table[torch.nn.functional.relu] = METHODS["relu"]
    for cls in (torch.Tensor, torch._C.TensorBase):
        table[cls.__getitem__] = torch_getitem
        for dunder, op in _DUNDERS.items():
            fn = OPS[op]
            if hasattr(cls, f"__{dunder}__"):
                table[getattr(cls, f"__{dunder}__")] = fn
            if hasattr(cls, f"__r{dunder}__"):
                table[getattr(cls, f"__r{dunder}__")] = (lambda f: lambda a, b: f(b, a))(fn)
        for dunder, op in (("neg", "neg"), ("invert", "not_"), ("abs", "abs"),
                           ("pos", "positive")):
            if hasattr(cls, f"__{dunder}__"):
                table[getattr(cls, f"__{dunder}__")] = OPS[op]
    return table


_TABLE: Optional[dict] = None


def op_name(func: Any) -> str:
    """A readable name for a torch callable: 'torch.sin', 'Tensor.sin',
    'torch.nn.functional.gelu'."""
    import torch

    name = getattr(func, "__name__", None) or repr(func)
    if getattr(torch, name, None) is func:
        return f"torch.{name}"
    if any(getattr(cls, name, None) is func for cls in (torch.Tensor, torch._C.TensorBase)):
        return f"Tensor.{name}"
    if getattr(torch.nn.functional, name, None) is func:
        return f"torch.nn.functional.{name}"
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else name


def call(func: Any, args: tuple, kwargs: dict) -> Any:
    """Runs the traced equivalent of ``func(*args, **kwargs)``; raises TraceError naming
    ``func`` when it has none."""
    global _TABLE
    if _TABLE is None:
        _TABLE = _table()
    handler = _TABLE.get(func)
    if handler is None:
        raise untraceable(op_name(func))
    return handler(*args, **kwargs)
