"""Flex attention: FlexAttention-style ``score_mod`` / ``mask_mod`` functions, traced into
sdpa's C++ expression programs and run by the fused CPU kernels, with their backward.

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)          # slopes: a torch tensor

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    block_mask = sdpa.create_block_mask(causal, None, None, L, S)
    out = sdpa.flex_attention(q, k, v, score_mod=alibi, block_mask=block_mask)

A mod is called once with proxy objects standing for score, b, h, q_idx and kv_idx; what
it does to them (operators, comparisons, ``&`` ``|`` ``~``, ``torch.where``,
``torch.tanh`` / ``exp`` / ``log`` / ``sigmoid`` / ``sqrt`` / ``abs`` / ``minimum`` /
``maximum`` and the same methods, indexing captured torch tensors with expressions) is
recorded (``__torch_function__`` for torch calls). Existing torch FlexAttention mods run
unchanged. Python control flow on a proxy (``if q_idx > 3:``) cannot be traced and raises
TypeError; use ``torch.where``. numpy arrays cannot see proxies inside ``[]``: wrap them
with :func:`capture`. Semantics follow ``torch.nn.attention.flex_attention``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional

from . import _C, _convert

__all__ = [
    "BlockMask", "and_masks", "capture", "create_block_mask", "flex_attention", "noop_mask",
    "or_masks", "causal_mask", "sliding_window", "prefix_lm", "document", "alibi",
    "relative_position", "soft_cap",
]


# ---- tracing ------------------------------------------------------------------------

def _expr(x: Any) -> "_C.Expr":
    """The C++ expression of a proxy or a Python scalar."""
    if isinstance(x, Proxy):
        return x.expr
    if isinstance(x, bool):
        return _C.expr_bool(x)
    if isinstance(x, int):
        return _C.expr_int(x)
    if isinstance(x, float):
        return _C.expr_float(x)
    if _convert.is_torch_tensor(x) and x.dim() == 0:
        value = x.item()
        return _expr(value)
    raise TypeError(f"flex: cannot use a {type(x).__name__} in a score_mod/mask_mod "
                    "expression (expected an expression, a Python number or a 0-d tensor)")


def _binary(name: str, reflected: bool = False):
    fn = getattr(_C, name)
    if reflected:
        return lambda self, other: Proxy(fn(_expr(other), self.expr))
    return lambda self, other: Proxy(fn(self.expr, _expr(other)))


def _unary(name: str):
    fn = getattr(_C, name)
    return lambda self: Proxy(fn(self.expr))


class Proxy:
    """A traced value inside a mod (see the module docstring)."""

    __slots__ = ("expr",)

    def __init__(self, expr: "_C.Expr"):
        self.expr = expr

    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("sub"), _binary("sub", True)
    __mul__, __rmul__ = _binary("mul"), _binary("mul", True)
    __truediv__, __rtruediv__ = _binary("truediv"), _binary("truediv", True)
    __floordiv__, __rfloordiv__ = _binary("floordiv"), _binary("floordiv", True)
    __mod__, __rmod__ = _binary("mod"), _binary("mod", True)
    __lt__, __le__ = _binary("lt"), _binary("le")
    __gt__, __ge__ = _binary("gt"), _binary("ge")
    __eq__, __ne__ = _binary("eq"), _binary("ne")  # type: ignore[assignment]
    __and__, __rand__ = _binary("and_"), _binary("and_", True)
    __or__, __ror__ = _binary("or_"), _binary("or_", True)
    __neg__, __invert__, __abs__ = _unary("neg"), _unary("not_"), _unary("abs")
    exp, log, tanh, sigmoid, sqrt, abs = (_unary(n) for n in ("exp", "log", "tanh", "sigmoid",
                                                              "sqrt", "abs"))
    __hash__ = None  # type: ignore[assignment]

    def logical_not(self) -> "Proxy":
        return Proxy(_C.not_(self.expr))

    def float(self) -> "Proxy":
        return Proxy(_C.to_float(self.expr))

    def __bool__(self):
        raise TypeError("flex: a score_mod/mask_mod cannot branch on a traced value "
                        "(Python `if`, `and`, `or`, `min`/`max` of expressions); use "
                        "torch.where / & / | / torch.minimum instead")

    def __index__(self):
        raise TypeError("flex: only torch tensors can be indexed by a traced expression "
                        "directly; wrap numpy arrays with sdpa.flex.capture(array)")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_call(func, args, kwargs or {})


class _PartialRead:
    """A captured tensor indexed in fewer dimensions than it has: t[h] of a 2-D t."""

    __slots__ = ("captured", "indices")

    def __init__(self, captured: "_C.Captured", indices: list):
        self.captured, self.indices = captured, indices

    def __getitem__(self, index: Any) -> Any:
        return _read(self.captured, self.indices, index)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise TypeError(f"flex: {func} on a partially indexed captured tensor; index every "
                        "dimension first")


def _read(captured: "_C.Captured", done: list, index: Any) -> Any:
    more = list(index) if isinstance(index, tuple) else [index]
    indices = done + [_expr(i) for i in more]
    if len(indices) > captured.ndim:
        raise TypeError(f"flex: '{captured.name}' has {captured.ndim} dimensions, indexed "
                        f"with {len(indices)}")
    if len(indices) < captured.ndim:
        return _PartialRead(captured, indices)
    return Proxy(captured.read(indices))


class _Trace:
    """The tensors captured while tracing one mod (by identity, so one tensor read
    twice is one captured tensor), and the torch tensors among them, in capture order."""

    active: Optional["_Trace"] = None

    def __init__(self):
        self.by_id: dict[int, "_C.Captured"] = {}
        self.sources: dict[str, Any] = {}  # captured name -> the array, in capture order
        self.counter = itertools.count()

    def capture(self, array: Any, name: Optional[str], requires_grad: bool) -> "_C.Captured":
        key = id(array)
        if key not in self.by_id:
            source = array.detach() if _convert.is_torch_tensor(array) else array
            label = name or f"captured{next(self.counter)}"
            while label in self.sources:  # names map gradients back: keep them unique
                label = f"{label}_{next(self.counter)}"
            self.by_id[key] = _C.Captured(label, source, requires_grad)
            self.sources[label] = array
        return self.by_id[key]


class capture:  # noqa: N801 (a function-like wrapper, named as torch's helpers are)
    """Wraps an array (numpy, jax, torch...) so a mod can index it with expressions:
    ``table = sdpa.flex.capture(np_table); ... table[h, q_idx - kv_idx]``. torch tensors
    need no wrapping. ``requires_grad``: flex_attention_backward returns its gradient."""

    def __init__(self, array: Any, name: Optional[str] = None, requires_grad: bool = False):
        self.array, self.name, self.requires_grad = array, name, requires_grad

    def __getitem__(self, index: Any) -> Any:
        trace = _Trace.active
        if trace is None:
            raise TypeError("sdpa.flex.capture: index it only inside a traced mod")
        return _read(trace.capture(self.array, self.name, self.requires_grad), [], index)


def _torch_getitem(tensor: Any, index: Any) -> Any:
    trace = _Trace.active
    if trace is None:
        raise TypeError("flex: indexing with a traced expression outside a mod")
    return _read(trace.capture(tensor, None, bool(tensor.requires_grad)), [], index)


def _torch_table():
    import torch

    def where(cond, a, b):
        return Proxy(_C.where(_expr(cond), _expr(a), _expr(b)))

    def unary(name):
        return lambda x, *a, **k: Proxy(getattr(_C, name)(_expr(x)))

    def binary(name):
        return lambda x, y, *a, **k: Proxy(getattr(_C, name)(_expr(x), _expr(y)))

    def clamp(x, min=None, max=None):  # noqa: A002 (torch's argument names)
        e = _expr(x)
        if min is not None:
            e = _C.maximum(e, _expr(min))
        if max is not None:
            e = _C.minimum(e, _expr(max))
        return Proxy(e)

    table = {
        torch.where: where, torch.clamp: clamp, torch.Tensor.clamp: clamp,
        torch.Tensor.__getitem__: _torch_getitem,
        torch._C.TensorBase.__getitem__: _torch_getitem,
    }
    for name in ("exp", "log", "tanh", "sigmoid", "sqrt", "abs"):
        table[getattr(torch, name)] = unary(name)
        table[getattr(torch.Tensor, name)] = unary(name)
    table[torch.logical_not] = unary("not_")
    for name, ours in (("minimum", "minimum"), ("maximum", "maximum"), ("logical_and", "and_"),
                       ("logical_or", "or_"), ("add", "add"), ("sub", "sub"), ("mul", "mul"),
                       ("div", "truediv"), ("remainder", "mod"), ("floor_divide", "floordiv"),
                       ("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"),
                       ("ge", "ge")):
        table[getattr(torch, name)] = binary(ours)
    # Operators with a torch tensor on the left and a proxy on the right.
    for dunder, ours, reflected in (("__add__", "add", False), ("__radd__", "add", True),
                                    ("__sub__", "sub", False), ("__rsub__", "sub", True),
                                    ("__mul__", "mul", False), ("__rmul__", "mul", True),
                                    ("__truediv__", "truediv", False),
                                    ("__rtruediv__", "truediv", True)):
        fn = binary(ours)
        table[getattr(torch.Tensor, dunder)] = (lambda f: lambda x, y: f(y, x))(fn) if reflected else fn
    return table


_TORCH_TABLE: Optional[dict] = None


def _torch_call(func, args, kwargs):
    global _TORCH_TABLE
    if _TORCH_TABLE is None:
        _TORCH_TABLE = _torch_table()
    handler = _TORCH_TABLE.get(func)
    if handler is None:
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        raise TypeError(f"flex: {name} cannot be traced into a score_mod/mask_mod program "
                        "(supported: arithmetic, comparisons, &, |, ~, where, clamp, minimum, "
                        "maximum, abs, exp, log, tanh, sigmoid, sqrt, captured tensor reads)")
    return handler(*args, **kwargs)


def _trace(mod: Callable, is_mask: bool) -> tuple["_C.Program", dict]:
    trace = _Trace()

    def run(*placeholders):
        outer, _Trace.active = _Trace.active, trace
        try:
            result = mod(*(Proxy(p) for p in placeholders))
        except IndexError as e:  # numpy refuses a proxy inside [] before asking it
            raise TypeError(f"flex: could not index an array with a traced expression ({e}); "
                            "only torch tensors can be indexed directly: wrap other arrays "
                            "with sdpa.flex.capture(array)") from e
        finally:
            _Trace.active = outer
        return _expr(result)

    program = _C.Program.from_mask_mod(run) if is_mask else _C.Program.from_score_mod(run)
    return program, trace.sources


# ---- BlockMask ----------------------------------------------------------------------

class BlockMask:
    """FlexAttention's BlockMask, built by :func:`create_block_mask` in O(blocks) memory.

    Fields (numpy int32 arrays): kv_num_blocks / full_kv_num_blocks [B, H, q_blocks],
    kv_indices / full_kv_indices [B, H, q_blocks, kv_blocks] and the q-side transposes
    q_num_blocks, q_indices, full_q_num_blocks, full_q_indices. ``str()`` draws the
    blocks ('#' full, '+' partial, '.' empty) with the sparsity; :meth:`to_png` renders it.
    """

    _FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
               "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")

    def __init__(self, cpp: "_C.BlockMask", mask_mod: Callable):
        self._cpp, self.mask_mod = cpp, mask_mod
        self.shape = (cpp.batch, cpp.num_heads, cpp.q_len, cpp.kv_len)
        self.BLOCK_SIZE = (cpp.block_size, cpp.block_size)

    def __getattr__(self, name: str) -> Any:
        if name in BlockMask._FIELDS:
            import numpy as np

            return np.from_dlpack(getattr(self._cpp, name))
        raise AttributeError(name)

    def sparsity(self) -> float:
        """Percentage of blocks that are skipped (FlexAttention's BlockMask.sparsity)."""
        return 100.0 * (1.0 - self._cpp.density())

    def to_string(self, b: int = 0, h: int = 0, max_size: int = 64) -> str:
        return self._cpp.to_string(b, h, max_size)

    def __str__(self) -> str:
        return self.to_string()

    def to_png(self, path: str, b: int = 0, h: int = 0) -> None:
        """Saves the block picture of (b, h) as a PNG (needs matplotlib): full blocks
        dark, partial blocks grey, empty blocks white."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        image = np.zeros((self._cpp.num_q_blocks, self._cpp.num_kv_blocks))
        for field, value in (("kv", 0.5), ("full_kv", 1.0)):
            num = np.from_dlpack(getattr(self._cpp, f"{field}_num_blocks"))[b, h]
            idx = np.from_dlpack(getattr(self._cpp, f"{field}_indices"))[b, h]
            for row in range(image.shape[0]):
                image[row, idx[row, :num[row]]] = value
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.imshow(image, cmap="Greys", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_xlabel("kv block")
        ax.set_ylabel("q block")
        ax.set_title(f"BlockMask {self.shape}, sparsity {self.sparsity():.1f}%")
        fig.savefig(path)
        plt.close(fig)


def create_block_mask(mask_mod: Callable, B: Optional[int], H: Optional[int], Q_LEN: int,
                      KV_LEN: int, device: Any = None, BLOCK_SIZE: int = 128) -> BlockMask:
    """FlexAttention's create_block_mask: the blocks of ``mask_mod(b, h, q_idx, kv_idx)``
    for [B, H, Q_LEN, KV_LEN] (None: 1, broadcast), decided block by block by interval
    analysis where possible and element by element otherwise, never with a dense mask.
    ``device`` is accepted for torch compatibility (CPU only). Raises sdpa.Error for
    invalid sizes or an out-of-range captured read."""
    program, _ = _trace(mask_mod, is_mask=True)
    cpp = _C.create_block_mask(program, B or 1, H or 1, int(Q_LEN), int(KV_LEN), int(BLOCK_SIZE))
    return BlockMask(cpp, mask_mod)


def noop_mask(b, h, q_idx, kv_idx):
    """Keeps every element."""
    return q_idx >= 0


def and_masks(*mods: Callable) -> Callable:
    """A mask_mod true where every one of ``mods`` is."""
    if not mods:
        return noop_mask

    def mod(b, h, q_idx, kv_idx):
        result = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            result = result & m(b, h, q_idx, kv_idx)
        return result
    return mod


def or_masks(*mods: Callable) -> Callable:
    """A mask_mod true where any one of ``mods`` is."""
    if not mods:
        return lambda b, h, q_idx, kv_idx: q_idx < 0

    def mod(b, h, q_idx, kv_idx):
        result = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            result = result | m(b, h, q_idx, kv_idx)
        return result
    return mod


# ---- standard mods (FlexAttention's examples) ----------------------------------------

def causal_mask(b, h, q_idx, kv_idx):
    """q_idx >= kv_idx (top-left causal)."""
    return q_idx >= kv_idx


def sliding_window(window: int) -> Callable:
    """Causal window over the last ``window`` keys and the current one."""
    if window < 0:
        raise ValueError(f"sliding_window: expected window >= 0, got {window}")
    return lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx <= window)


def prefix_lm(prefix_len: int) -> Callable:
    """Keys before ``prefix_len`` visible to every query; causal after."""
    if prefix_len < 0:
        raise ValueError(f"prefix_lm: expected prefix_len >= 0, got {prefix_len}")
    return lambda b, h, q_idx, kv_idx: (kv_idx < prefix_len) | (q_idx >= kv_idx)


def document(document_id: Any) -> Callable:
    """Packed documents: ``document_id`` (int array [L], L == S) per position; queries see
    keys of their own document."""
    ids = document_id if _convert.is_torch_tensor(document_id) else capture(document_id, "document_id")
    return lambda b, h, q_idx, kv_idx: ids[q_idx] == ids[kv_idx]


def alibi(slopes: Any) -> Callable:
    """ALiBi: score - slopes[h] * |q_idx - kv_idx| (slopes float [H])."""
    s = slopes if _convert.is_torch_tensor(slopes) else capture(slopes, "slopes")
    return lambda score, b, h, q_idx, kv_idx: score - s[h] * abs(q_idx - kv_idx)


def relative_position(table: Any, max_distance: int, requires_grad: bool = False) -> Callable:
    """score + table[h, q_idx - kv_idx + max_distance], table float [H, 2 max_distance + 1]
    (a torch tensor with requires_grad gets its gradient through autograd)."""
    t = table if _convert.is_torch_tensor(table) else capture(table, "rel_bias", requires_grad)
    return lambda score, b, h, q_idx, kv_idx: score + t[h, q_idx - kv_idx + max_distance]


def soft_cap(cap: float) -> Callable:
    """Tanh soft-capping (Gemma 2, Grok): cap * tanh(score / cap)."""
    if not cap > 0:
        raise ValueError(f"soft_cap: expected cap > 0, got {cap}")
    return lambda score, b, h, q_idx, kv_idx: cap * (score / cap).tanh()


# ---- flex_attention -------------------------------------------------------------------

def flex_attention(query: Any, key: Any, value: Any, score_mod: Optional[Callable] = None,
                   block_mask: Optional[BlockMask] = None, scale: Optional[float] = None,
                   enable_gqa: bool = False, return_lse: bool = False) -> Any:
    """torch.nn.attention.flex_attention on CPU: softmax(score_mod(q k^T * scale)) v
    restricted to ``block_mask`` (partial blocks: its mask_mod), any framework with
    __dlpack__; torch tensors get autograd (q, k, v and captured torch tensors that
    require grad, e.g. a learnable bias table). query [B, Hq, L, E], key [B, Hkv, S, E],
    value [B, Hkv, S, Ev]. Returns out [B, Hq, L, Ev] (and lse float32 [B, Hq, L] with
    return_lse). Fully masked rows give zeros (torch: zeros too). Raises sdpa.Error for
    invalid input or an out-of-range captured read, TypeError for untraceable mods."""
    program, sources = _trace(score_mod, is_mask=False) if score_mod is not None else (None, {})
    cpp_mask = block_mask._cpp if block_mask is not None else None
    if _convert.is_torch_tensor(query):
        from .torch import _flex_autograd

        out, lse = _flex_autograd(query, key, value, program, cpp_mask, scale, enable_gqa, sources)
        return (out, lse) if return_lse else out
    out, lse, _ = _C.flex_attention(query, key, value, program, cpp_mask, scale, enable_gqa)
    out = _convert.like(out, query)
    return (out, _convert.like(lse, query)) if return_lse else out


def flex_attention_backward(grad_out: Any, query: Any, key: Any, value: Any, out: Any,
                            lse: Any, score_mod: Optional[Callable] = None,
                            block_mask: Optional[BlockMask] = None,
                            scale: Optional[float] = None, enable_gqa: bool = False) -> tuple:
    """Gradients of :func:`flex_attention` for any framework: (grad_q, grad_k, grad_v,
    [gradient of each tensor the score_mod captured with requires_grad, else None]),
    d(score_mod)/d(score) derived symbolically from the traced program."""
    program = _trace(score_mod, is_mask=False)[0] if score_mod is not None else None
    cpp_mask = block_mask._cpp if block_mask is not None else None
    gq, gk, gv, captured = _C.flex_attention_backward(grad_out, query, key, value, out, lse,
                                                      program, cpp_mask, scale, enable_gqa)
    like = lambda t: None if t is None else _convert.like(t, query)  # noqa: E731
    return like(gq), like(gk), like(gv), [like(t) for t in captured]
