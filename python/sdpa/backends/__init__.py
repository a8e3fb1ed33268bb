"""Process-wide backend flags (torch.backends.cuda.enable_*_sdp) and the active list.

The flags apply where no ``sdpa.sdpa_kernel`` guard is active; the ``*_enabled()``
queries report the calling thread's effective state (guard first, then flag).
"""

from .._C import (
    active_backends,
    cudnn_sdp_enabled,
    default_priority_order,
    enable_cudnn_sdp,
    enable_flash_sdp,
    enable_math_sdp,
    enable_mem_efficient_sdp,
    enable_overrideable_sdp,
    flash_sdp_enabled,
    math_sdp_enabled,
    mem_efficient_sdp_enabled,
    overrideable_sdp_enabled,
)
from . import cpu

__all__ = [
    "active_backends",
    "cpu",
    "cudnn_sdp_enabled",
    "default_priority_order",
    "enable_cudnn_sdp",
    "enable_flash_sdp",
    "enable_math_sdp",
    "enable_mem_efficient_sdp",
    "enable_overrideable_sdp",
    "flash_sdp_enabled",
    "math_sdp_enabled",
    "mem_efficient_sdp_enabled",
    "overrideable_sdp_enabled",
]
