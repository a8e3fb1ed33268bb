"""Mirrors torch.nn.attention: SDPBackend, sdpa_kernel and the ``bias`` module."""

from .._C import SDPBackend
from .._kernel import sdpa_kernel
from . import bias

__all__ = ["SDPBackend", "sdpa_kernel", "bias"]
