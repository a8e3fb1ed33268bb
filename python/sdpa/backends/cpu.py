"""CPU kernel capability (torch.backends.cpu.get_cpu_capability)."""

from .._C import (amx_bf16_available, detected_cpu_capability, get_cpu_capability,
                  set_cpu_capability)

__all__ = ["get_cpu_capability", "detected_cpu_capability", "set_cpu_capability",
           "amx_bf16_available"]
