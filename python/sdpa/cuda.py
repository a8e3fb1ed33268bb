"""sdpa.cuda: whether CUDA tensors can be used, the devices, and sdpa's device memory.

Every function exists in every build: without CUDA support is_built() is False,
device_count() is 0 and unavailable_reason() says why. Attention on CUDA arrays goes
through sdpa.scaled_dot_product_attention (``stream=`` picks the CUDA stream).
"""

from __future__ import annotations

from typing import Any

from . import _C, _convert

__all__ = [
    "cudnn_is_built",
    "device_count",
    "device_description",
    "graph_cache_stats",
    "is_available",
    "is_built",
    "memory_stats",
    "reset_peak_memory",
    "synchronize",
    "unavailable_reason",
]


def is_built() -> bool:
    """Whether sdpa was built with CUDA (CMake option SDPA_CUDA)."""
    return _C.cuda_is_built()


def cudnn_is_built() -> bool:
    """Whether the CUDNN_ATTENTION backend was built (cuDNN 9 and its frontend)."""
    return _C.cuda_cudnn_is_built()


def device_count() -> int:
    """Number of CUDA devices this process can use: 0 without a CUDA build, a driver or a
    GPU (never raises)."""
    return _C.cuda_device_count()


def is_available() -> bool:
    """device_count() > 0."""
    return _C.cuda_is_available()


def unavailable_reason() -> str:
    """Why is_available() is False, e.g. "no CUDA device in this machine"; "" when it is
    True. What a skipped GPU test prints."""
    return _C.cuda_unavailable_reason()


def device_description(device: int = 0) -> str:
    """One line about CUDA device `device`: name, compute capability, SM count, memory
    in MiB and driver version. Raises sdpa.Error without such a device."""
    return _C.cuda_device_description(int(device))


def memory_stats(device: int = 0) -> dict:
    """Bytes of device memory that sdpa's tensors and scratch hold on `device`:
    ``{"current_bytes": now, "peak_bytes": most since the last reset_peak_memory}``.
    Memory of tensors handed to a framework counts until the framework frees them."""
    return _C.cuda_memory_stats(int(device))


def reset_peak_memory(device: int = 0) -> None:
    """Sets memory_stats(device)["peak_bytes"] to the current bytes, so a following
    call's extra memory can be read."""
    _C.cuda_reset_peak_memory(int(device))


def graph_cache_stats() -> dict:
    """Counters of the cuDNN graph cache (CUDNN_ATTENTION builds a graph per distinct call
    signature and keeps the most recent): ``{"hits", "misses", "size", "capacity"}``,
    each a count of calls or graphs. All zero when cudnn_is_built() is False."""
    return _C.cuda_graph_cache_stats()


def synchronize(stream: Any = None) -> None:
    """Waits (releasing the GIL) until the work queued on `stream` has finished: a
    cudaStream_t as an int or an object with ``.cuda_stream``; None, the legacy default
    stream of the current device. Raises sdpa.Error without a device."""
    _C.cuda_synchronize(_convert.stream_handle(stream))
