"""Drop-in call shapes of other attention libraries, so existing code switches to sdpa by
changing an import: ``sdpa.compat.flash_attn`` (flash-attn's functional API, BSHD layout)
and ``sdpa.compat.xformers`` (xFormers' ``memory_efficient_attention`` and its
``fmha.attn_bias`` masks, BMHK layout). CPU arrays of any framework with ``__dlpack__``;
torch tensors get autograd."""

from . import flash_attn, xformers

__all__ = ["flash_attn", "xformers"]
