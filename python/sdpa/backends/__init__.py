"""Process-wide backend flags (torch.backends.cuda.enable_*_sdp), the active list, and
torch's per-call checks (SDPAParams, can_use_flash_attention and its siblings).

The flags apply where no ``sdpa.sdpa_kernel`` guard is active; the ``*_enabled()``
queries report the calling thread's effective state (guard first, then flag). The
``can_use_*`` checks ignore both, as torch's do.
"""

from .._C import (
    active_backends,
    allow_fp16_bf16_reduction_math_sdp,
    cudnn_sdp_enabled,
    default_priority_order,
    enable_cudnn_sdp,
    enable_flash_sdp,
    enable_math_sdp,
    enable_mem_efficient_sdp,
    enable_overrideable_sdp,
    flash_sdp_enabled,
    fp16_bf16_reduction_math_sdp_allowed,
    math_sdp_enabled,
    mem_efficient_sdp_enabled,
    overrideable_sdp_enabled,
)
from . import cpu
from ._params import (
    SDPAParams,
    can_use_cudnn_attention,
    can_use_efficient_attention,
    can_use_flash_attention,
)

__all__ = [
    "SDPAParams",
    "active_backends",
    "allow_fp16_bf16_reduction_math_sdp",
    "can_use_cudnn_attention",
    "can_use_efficient_attention",
    "can_use_flash_attention",
    "cpu",
    "cudnn_sdp_enabled",
    "default_priority_order",
    "enable_cudnn_sdp",
    "enable_flash_sdp",
    "enable_math_sdp",
    "enable_mem_efficient_sdp",
    "enable_overrideable_sdp",
    "flash_sdp_enabled",
    "fp16_bf16_reduction_math_sdp_allowed",
    "math_sdp_enabled",
    "mem_efficient_sdp_enabled",
    "overrideable_sdp_enabled",
]
