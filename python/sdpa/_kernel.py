"""sdpa_kernel: the per-thread backend restriction (torch.nn.attention.sdpa_kernel)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from . import _C


def _backend(value: Any) -> "_C.SDPBackend":
    if isinstance(value, _C.SDPBackend):
        return value
    if isinstance(value, str):
        return _C.parse_backend(value)
    name = getattr(value, "name", None)  # torch.nn.attention.SDPBackend and other enums
    if isinstance(name, str):
        return _C.parse_backend(name)
    raise TypeError(f"backends: expected SDPBackend values (or their names), got {value!r}")


def backend_list(backends: Any) -> list:
    """A list of SDPBackend from one backend, a name, or an iterable of them."""
    if isinstance(backends, (str, _C.SDPBackend)) or hasattr(backends, "name"):
        return [_backend(backends)]
    return [_backend(b) for b in backends]


@contextlib.contextmanager
def sdpa_kernel(backends: Any, set_priority: bool = False) -> Iterator[None]:
    """Restricts the calling thread's attention calls to ``backends`` while the block runs
    (torch.nn.attention.sdpa_kernel). With ``set_priority`` they are tried in the given
    order, else in the default order. Guards nest (the innermost wins) and are per-thread:
    other threads keep their own state. Accepts sdpa.SDPBackend, torch's SDPBackend, names
    ("math", "flash"), or a list of them. Also usable as a decorator."""
    guard = _C._KernelGuard(backend_list(backends), bool(set_priority))
    guard.enter()
    try:
        yield
    finally:
        guard.exit()


def current_restriction() -> "list | None":
    """The calling thread's sdpa_kernel restriction (backends in the order they are tried),
    or None without a guard. A forward records it for its backward: torch's autograd
    engine runs the backward of CUDA tensors on its own threads, and a backward may run
    after the guard's block has ended, yet it belongs to the forward's backends (as
    torch's backward belongs to the kernel its forward chose)."""
    return _C.active_backends() if _C.sdpa_kernel_active() else None


@contextlib.contextmanager
def restricted(backends: "list | None") -> Iterator[None]:
    """Runs the block under a restriction current_restriction() returned (None: as is)."""
    if backends is None:
        yield
        return
    with sdpa_kernel(backends, set_priority=True):
        yield
