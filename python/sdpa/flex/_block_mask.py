"""BlockMask: FlexAttention's block sparsity of a mask_mod, built by the C++ library in
O(blocks) memory, with its index arrays, a text picture and a matplotlib rendering."""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from .. import _C, _convert
from ._trace import trace


class BlockMask:
    """FlexAttention's BlockMask, made by :func:`create_block_mask`.

    Attributes: ``shape`` (B, H, Q_LEN, KV_LEN), ``BLOCK_SIZE`` (q, kv), ``seq_lengths``
    (Q_LEN, KV_LEN), ``mask_mod``, and the index arrays (int32 views of the C++ ones:
    torch tensors for a mask made from torch inputs — a torch ``device``, a mod reading
    torch tensors, torch block lists — else read-only numpy arrays): kv_num_blocks /
    full_kv_num_blocks [B, H, q_blocks], kv_indices / full_kv_indices [B, H, q_blocks, kv_blocks] (the first num_blocks entries of each
    row valid, ascending), and the q-side transposes q_num_blocks / full_q_num_blocks
    [B, H, kv_blocks], q_indices / full_q_indices [B, H, kv_blocks, q_blocks]. "kv" lists
    hold partial blocks (mask_mod evaluated per element), "full_kv" lists blocks whose
    elements are all kept; other blocks are never computed. ``str()`` draws the blocks
    of (b=0, h=0) ('#' full, '+' partial, '.' empty) with the sparsity.
    """

    @classmethod
    def from_kv_blocks(cls, kv_num_blocks: Any, kv_indices: Any, full_kv_num_blocks: Any = None,
                       full_kv_indices: Any = None, BLOCK_SIZE: Any = 128,  # noqa: N803
                       mask_mod: Optional[Callable] = None, seq_lengths: Any = None,
                       compute_q_blocks: bool = True) -> "BlockMask":
        """torch's BlockMask.from_kv_blocks: a BlockMask from kv-side block lists (any
        array with __dlpack__): kv_num_blocks [B, H, q_blocks] and kv_indices [B, H,
        q_blocks, n] (the first count entries of a row name its partial kv blocks, in any
        order), optional full_* lists of the same shapes; torch lists on a GPU are copied
        to the CPU, other arrays must be there. Partial blocks run ``mask_mod``
        (without one they are kept whole), full blocks skip it. seq_lengths defaults to
        (q_blocks * q block, n * kv block). ``compute_q_blocks`` is accepted for torch
        compatibility: the q-side lists are always derived. Raises sdpa.Error for bad
        shapes, counts, indices out of range or a block listed twice."""
        q_block, kv_block = _block_sizes(BLOCK_SIZE)
        if seq_lengths is None:
            seq_lengths = (kv_indices.shape[-2] * q_block, kv_indices.shape[-1] * kv_block)
        program = None if mask_mod is None or mask_mod is noop_mask else \
            trace(mask_mod, is_mask=True)[0]
        if _convert.is_torch_tensor(kv_num_blocks):  # lists are read on the CPU
            kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices = (
                _host(t) for t in (kv_num_blocks, kv_indices, full_kv_num_blocks,
                                   full_kv_indices))
        cpp = _C.block_mask_from_kv_blocks(kv_num_blocks, kv_indices, full_kv_num_blocks,
                                           full_kv_indices, int(seq_lengths[0]),
                                           int(seq_lengths[1]), q_block, kv_block, program)
        torch_lists = _convert.is_torch_tensor(kv_num_blocks)
        return cls(cpp, mask_mod or noop_mask, cpp.batch, cpp.num_heads, torch_lists)

    _FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
               "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")

    def __init__(self, cpp: "_C.BlockMask", mask_mod: Callable, B: int, H: int,
                 torch_arrays: bool = False):
        # The library keeps one batch / head when the mask_mod does not read b / h; the
        # arrays broadcast back to the B and H asked for, as torch's have them.
        self._cpp, self.mask_mod, self._torch_arrays = cpp, mask_mod, torch_arrays
        self.shape = (B, H, cpp.q_len, cpp.kv_len)
        self.seq_lengths = (cpp.q_len, cpp.kv_len)
        self.BLOCK_SIZE = (cpp.q_block_size, cpp.kv_block_size)

    def __getattr__(self, name: str) -> Any:
        if name in BlockMask._FIELDS:
            import numpy as np

            return self._framework(np.from_dlpack(getattr(self._cpp, name)))
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
        return self._framework(dense)

    def _framework(self, array: Any) -> Any:
        """`array` [stored B, stored H, ...] broadcast to (B, H): a torch view or numpy."""
        shape = self.shape[:2] + array.shape[2:]
        if self._torch_arrays:
            import torch

            return torch.from_numpy(array.copy()).expand(shape)
        import numpy as np

        return np.broadcast_to(array, shape)

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


def _block_sizes(BLOCK_SIZE: Any) -> tuple:  # noqa: N803 (torch's argument name)
    """(q block, kv block) from an int or a (q, kv) pair."""
    if isinstance(BLOCK_SIZE, (tuple, list)):
        if len(BLOCK_SIZE) != 2:
            raise ValueError(f"create_block_mask: BLOCK_SIZE {tuple(BLOCK_SIZE)}: expected an "
                             "int or a (q, kv) pair")
        return int(BLOCK_SIZE[0]), int(BLOCK_SIZE[1])
    return int(BLOCK_SIZE), int(BLOCK_SIZE)


def create_block_mask(mask_mod: Callable, B: Optional[int], H: Optional[int], Q_LEN: int,
                      KV_LEN: int, device: Any = None, BLOCK_SIZE: Any = 128,
                      _compile: bool = False) -> BlockMask:
    """FlexAttention's create_block_mask: the blocks of ``mask_mod(b, h, q_idx, kv_idx)``
    (a bool-valued mod, traced once) over [B, H, Q_LEN, KV_LEN] with blocks of BLOCK_SIZE
    (an int, or a (q rows, kv columns) pair as torch's). B or H None means 1 (broadcast).
    Blocks are decided by interval analysis of the traced program where possible and
    element by element otherwise; memory is O(blocks), never a dense mask. The blocks are
    computed on the CPU whatever ``device`` says; a ``device`` given with torch loaded, or
    a mod reading torch tensors, makes the index fields torch tensors (torch's helpers
    call ``kv_num_blocks.clone()``). ``_compile`` is accepted and ignored.

    Raises TypeError for an untraceable mod, sdpa.Error for B or H < 1, negative lengths,
    BLOCK_SIZE < 1, a mod that does not return bool, or a captured tensor read out of
    range; ValueError for a BLOCK_SIZE sequence that is not a pair.
    """
    program, sources = trace(mask_mod, is_mask=True)
    B, H = 1 if B is None else int(B), 1 if H is None else int(H)
    cpp = _C.create_block_mask(program, B, H, int(Q_LEN), int(KV_LEN), *_block_sizes(BLOCK_SIZE))
    torch_arrays = (device is not None and "torch" in sys.modules) or any(
        _convert.is_torch_tensor(a) for a in sources.values())
    return BlockMask(cpp, mask_mod, B, H, torch_arrays)


def _host(t: Any) -> Any:
    """A torch list as sdpa reads block lists: on the CPU, contiguous."""
    return None if t is None else t.cpu().contiguous()


def as_block_mask(block_mask: Any) -> Optional[BlockMask]:
    """An sdpa BlockMask for flex_attention's argument: None, an sdpa BlockMask, or a
    torch.nn.attention.flex_attention.BlockMask, taken over with its own block lists,
    sizes and block size and its traced mask_mod (torch's noop_mask, the mask of one
    made from block indices alone, is left out: its listed blocks are kept whole). Lists
    on a GPU are copied to the CPU; the mask_mod may read tensors of the call's device.
    Raises TypeError for other objects."""
    if block_mask is None or isinstance(block_mask, BlockMask):
        return block_mask
    torch_type = type(block_mask)
    if torch_type.__name__ == "BlockMask" and torch_type.__module__.startswith("torch."):
        from torch.nn.attention.flex_attention import noop_mask as torch_noop

        mask_mod = None if block_mask.mask_mod is torch_noop else block_mask.mask_mod
        # A B or H of 1 in torch's lists broadcasts, as in sdpa's.
        return BlockMask.from_kv_blocks(
            block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
            block_mask.full_kv_indices,
            BLOCK_SIZE=tuple(block_mask.BLOCK_SIZE), mask_mod=mask_mod,
            seq_lengths=tuple(block_mask.seq_lengths))
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
