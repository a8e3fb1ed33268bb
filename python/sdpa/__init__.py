"""sdpa: scaled dot-product attention with PyTorch's API on any DLPack array.

    import sdpa
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)  # numpy in, numpy out

Submodules: ``sdpa.backends`` (flags, ``cpu.get_cpu_capability()``), ``sdpa.attention``
(``sdpa_kernel``, ``SDPBackend``, ``bias``), ``sdpa.torch`` (the torch.library custom op:
autograd and torch.compile), ``sdpa.flex`` (FlexAttention: score_mod / mask_mod
traced into the library's programs, ``flex_attention``, ``create_block_mask``),
``sdpa.cuda`` (CUDA availability, devices, device memory),
``sdpa.info`` (``python -m sdpa.info``) and ``sdpa.integrations``. Neither numpy nor torch is imported until your arrays need them.
"""

import os as _os


def _load_extension():
    # libgomp fixes its wait policy when it loads, from the environment; by default its
    # idle workers spin for milliseconds after every parallel region, and on a machine
    # with other work they then wait for a core when the next region needs them (issue
    # 27: a MiniLM-layer call 17 times slower). The extension's libgomp loads here, so
    # unless the user chose a policy it loads passive (workers sleep). The variable is
    # removed again: OpenMP runtimes loaded later (torch's) and child processes keep
    # their own default. A libgomp already loaded by another module keeps its policy.
    chosen = "OMP_WAIT_POLICY" in _os.environ or "GOMP_SPINCOUNT" in _os.environ
    if not chosen:
        _os.environ["OMP_WAIT_POLICY"] = "passive"
    try:
        from . import _C
    finally:
        if not chosen:
            del _os.environ["OMP_WAIT_POLICY"]
    return _C


_C = _load_extension()
from ._C import (
    BackendVerdict,
    Error,
    Explanation,
    Generator,
    SDPBackend,
    Tensor,
    are_deterministic_algorithms_enabled,
    get_num_threads,
    manual_seed,
    memory_stats,
    reset_peak_memory,
    empty_cache,
    set_num_threads,
    use_deterministic_algorithms,
)
from ._api import (
    AttentionGradients,
    AttentionOutput,
    explain,
    scaled_dot_product_attention,
    scaled_dot_product_attention_backward,
    scaled_dot_product_attention_with_lse,
)
from ._kernel import sdpa_kernel
from . import attention, backends, cuda, flex, serving
from .flex import BlockMask, and_masks, create_block_mask, flex_attention, noop_mask, or_masks
from .serving import (append_paged_kv_cache, attention_varlen, attention_with_kvcache,
                      merge_attention_states)

import sys as _sys

if _sys.modules.get("torch") is not None:
    # torch is loaded: register the sdpa::attention op now, so torch tensors routed
    # through sdpa.scaled_dot_product_attention never import it mid-trace.
    from . import torch as _torch_api  # noqa: F401
del _sys

__version__ = _C.version()

#: The process-wide dropout generator used when a call names none.
default_generator = _C.default_generator()

__all__ = [
    "BlockMask",
    "and_masks",
    "create_block_mask",
    "flex",
    "flex_attention",
    "noop_mask",
    "or_masks",
    "AttentionGradients",
    "AttentionOutput",
    "BackendVerdict",
    "Error",
    "Explanation",
    "Generator",
    "SDPBackend",
    "Tensor",
    "are_deterministic_algorithms_enabled",
    "attention",
    "append_paged_kv_cache",
    "attention_varlen",
    "attention_with_kvcache",
    "backends",
    "cuda",
    "default_generator",
    "explain",
    "get_num_threads",
    "manual_seed",
    "memory_stats",
    "merge_attention_states",
    "reset_peak_memory",
    "empty_cache",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "scaled_dot_product_attention_with_lse",
    "sdpa_kernel",
    "serving",
    "set_num_threads",
    "use_deterministic_algorithms",
]


def __getattr__(name):
    # sdpa.torch (imports torch) and sdpa.integrations load on first use.
    if name in ("torch", "integrations", "info"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
