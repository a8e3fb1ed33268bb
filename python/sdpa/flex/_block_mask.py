"""BlockMask: FlexAttention's block sparsity of a mask_mod, built by the C++ library in
O(blocks) memory, with its index arrays, a text picture and a matplotlib rendering."""

from __future__ import annotations

from typing import Any, Callable, Optional

from .. import _C
from ._trace import trace


class BlockMask:
    """FlexAttention's BlockMask, made by :func:`create_block_mask`.

    Attributes: ``shape`` (B, H, Q_LEN, KV_LEN), ``BLOCK_SIZE`` (q, kv), ``seq_lengths``
    (Q_LEN, KV_LEN), ``mask_mod``, and the index arrays (numpy int32, read-only views of
    the C++ ones): kv_num_blocks / full_kv_num_blocks [B, H, q_blocks], kv_indices /
    full_kv_indices [B, H, q_blocks, kv_blocks] (the first num_blocks entries of each
    row valid, ascending), and the q-side transposes q_num_blocks / full_q_num_blocks
    [B, H, kv_blocks], q_indices / full_q_indices [B, H, kv_blocks, q_blocks]. "kv" lists
    hold partial blocks (mask_mod evaluated per element), "full_kv" lists blocks whose
    elements are all kept; other blocks are never computed. ``str()`` draws the blocks
    of (b=0, h=0) ('#' full, '+' partial, '.' empty) with the sparsity.
    """

    _FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
               "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")

    def __init__(self, cpp: "_C.BlockMask", mask_mod: Callable, B: int, H: int):
        # The library keeps one batch / head when the mask_mod does not read b / h; the
        # arrays broadcast back to the B and H asked for, as torch's have them.
        self._cpp, self.mask_mod = cpp, mask_mod
        self.shape = (B, H, cpp.q_len, cpp.kv_len)
        self.seq_lengths = (cpp.q_len, cpp.kv_len)
        self.BLOCK_SIZE = (cpp.block_size, cpp.block_size)

    def __getattr__(self, name: str) -> Any:
        if name in BlockMask._FIELDS:
            import numpy as np

            array = np.from_dlpack(getattr(self._cpp, name))
            return np.broadcast_to(array, self.shape[:2] + array.shape[2:])
        raise AttributeError(f"'BlockMask' object has no attribute '{name}'")

    def sparsity(self) -> float:
        """Percentage of (q block, kv block) pairs never computed (as torch's)."""
        return 100.0 * (1.0 - self._cpp.density())

    def to_dense(self) -> Any:
        """numpy int32 [B, H, q_blocks, kv_blocks]: 0 empty, 1 partial, 2 full block."""
        import numpy as np

        dense = np.zeros((self._cpp.batch, self._cpp.num_heads, self._cpp.num_q_blocks,
                          self._cpp.num_kv_blocks), np.int32)
        for prefix, value in (("", 1), ("full_", 2)):
            num = np.from_dlpack(getattr(self._cpp, f"{prefix}kv_num_blocks"))
            idx = np.from_dlpack(getattr(self._cpp, f"{prefix}kv_indices"))
            valid = np.arange(idx.shape[-1]) < num[..., None]  # [B, H, q_blocks, kv_blocks]
            b, h, row, slot = np.nonzero(valid)
            dense[b, h, row, idx[b, h, row, slot]] = value
        return np.broadcast_to(dense, self.shape[:2] + dense.shape[2:])

    def _stored(self, b: int, h: int) -> tuple[int, int]:
        """The library's (b, h) for the asked-for (b, h); IndexError out of range."""
        if not (0 <= b < self.shape[0] and 0 <= h < self.shape[1]):
            raise IndexError(f"BlockMask: (b, h) = ({b}, {h}) outside B={self.shape[0]}, "
                             f"H={self.shape[1]}")
        return min(b, self._cpp.batch - 1), min(h, self._cpp.num_heads - 1)

    def to_string(self, b: int = 0, h: int = 0, max_size: int = 64) -> str:
        """The block picture of (b, h), subsampled beyond ``max_size`` blocks a side."""
        return self._cpp.to_string(*self._stored(b, h), max_size)

    def __str__(self) -> str:
        return self.to_string()

    def __repr__(self) -> str:
        return (f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, "
                f"sparsity={self.sparsity():.2f}%)")

    def plot(self, b: int = 0, h: int = 0, ax: Any = None) -> Any:
        """Draws the blocks of (b, h) on a matplotlib Axes (a new figure when ``ax`` is
        None): full blocks black, partial grey, empty white. Returns the Axes. Raises
        ImportError without matplotlib, IndexError for b or h out of range."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 5))
        self._stored(b, h)
        image = self.to_dense()[b, h] / 2.0
        ax.imshow(image, cmap="Greys", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_xlabel("kv block")
        ax.set_ylabel("q block")
        ax.set_title(f"BlockMask {self.shape} (b={b}, h={h}), sparsity {self.sparsity():.1f}%")
        return ax

    def to_png(self, path: str, b: int = 0, h: int = 0) -> None:
        """Saves :meth:`plot` of (b, h) as a PNG file (matplotlib's Agg backend, so no
        display is needed). Raises ImportError without matplotlib."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(5, 5))
        FigureCanvasAgg(fig)
        self.plot(b, h, fig.add_subplot())
        fig.savefig(path, format="png")


def _block_size(BLOCK_SIZE: Any) -> int:  # noqa: N803 (torch's argument name)
    if isinstance(BLOCK_SIZE, (tuple, list)):
        if len(BLOCK_SIZE) != 2 or BLOCK_SIZE[0] != BLOCK_SIZE[1]:
            raise ValueError(f"create_block_mask: BLOCK_SIZE {tuple(BLOCK_SIZE)}: only square "
                             "blocks (one size, or (n, n)) are supported")
        BLOCK_SIZE = BLOCK_SIZE[0]
    return int(BLOCK_SIZE)


def create_block_mask(mask_mod: Callable, B: Optional[int], H: Optional[int], Q_LEN: int,
                      KV_LEN: int, device: Any = None, BLOCK_SIZE: Any = 128,
                      _compile: bool = False) -> BlockMask:
    """FlexAttention's create_block_mask: the blocks of ``mask_mod(b, h, q_idx, kv_idx)``
    (a bool-valued mod, traced once) over [B, H, Q_LEN, KV_LEN] with square blocks of
    BLOCK_SIZE (an int or (n, n)). B or H None means 1 (broadcast). Blocks are decided
    by interval analysis of the traced program where possible and element by element
    otherwise; memory is O(blocks), never a dense mask. ``device`` and ``_compile`` are
    accepted for torch compatibility and ignored (the library runs on the CPU).

    Raises TypeError for an untraceable mod, sdpa.Error for B or H < 1, negative lengths,
    BLOCK_SIZE < 1, a mod that does not return bool, or a captured tensor read out of
    range; ValueError for non-square BLOCK_SIZE.
    """
    program, _ = trace(mask_mod, is_mask=True)
    B, H = 1 if B is None else int(B), 1 if H is None else int(H)
    cpp = _C.create_block_mask(program, B, H, int(Q_LEN), int(KV_LEN), _block_size(BLOCK_SIZE))
    return BlockMask(cpp, mask_mod, B, H)


def as_block_mask(block_mask: Any) -> Optional[BlockMask]:
    """An sdpa BlockMask for flex_attention's argument: None, an sdpa BlockMask, or a
    torch.nn.attention.flex_attention.BlockMask, rebuilt from its mask_mod, sizes and
    block size (a torch mask built from block indices alone, whose mask_mod keeps
    everything, cannot be rebuilt: ValueError). Raises TypeError for other objects."""
    if block_mask is None or isinstance(block_mask, BlockMask):
        return block_mask
    torch_type = type(block_mask)
    if torch_type.__name__ == "BlockMask" and torch_type.__module__.startswith("torch."):
        from torch.nn.attention.flex_attention import noop_mask

        if block_mask.mask_mod is noop_mask and block_mask.sparsity() > 0:
            raise ValueError("flex_attention: a torch BlockMask without a mask_mod (built from "
                             "block indices) cannot be converted; build it with "
                             "sdpa.create_block_mask(mask_mod, ...)")
        B, H = block_mask.kv_num_blocks.shape[:2]
        q_block, kv_block = block_mask.BLOCK_SIZE
        return create_block_mask(block_mask.mask_mod, B, H, *block_mask.seq_lengths,
                                 BLOCK_SIZE=max(q_block, kv_block))
    raise TypeError(f"block_mask: expected an sdpa.BlockMask (sdpa.create_block_mask), got "
                    f"{torch_type.__module__}.{torch_type.__qualname__}")


def noop_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    """A mask_mod keeping every element."""
    return q_idx >= 0


def _no_element(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
    return q_idx < 0


def and_masks(*mods: Callable) -> Callable:
    """A mask_mod true where every one of ``mods`` is (noop_mask for none). Raises
    TypeError for a non-callable."""
    _check_callables("and_masks", mods)
    if not mods:
        return noop_mask

    def and_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        result = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            result = result & m(b, h, q_idx, kv_idx)
        return result
    return and_mask


def or_masks(*mods: Callable) -> Callable:
    """A mask_mod true where any one of ``mods`` is (keeps nothing for none). Raises
    TypeError for a non-callable."""
    _check_callables("or_masks", mods)
    if not mods:
        return _no_element

    def or_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        result = mods[0](b, h, q_idx, kv_idx)
        for m in mods[1:]:
            result = result | m(b, h, q_idx, kv_idx)
        return result
    return or_mask


def _check_callables(name: str, mods: tuple) -> None:
    for i, m in enumerate(mods):
        if not callable(m):
            raise TypeError(f"{name}: argument {i} is a {type(m).__name__}, not a mask_mod")
