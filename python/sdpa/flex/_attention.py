"""flex_attention and its backward for any DLPack framework; torch tensors go through
``sdpa.torch``'s autograd Function."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from .. import _C, _convert
from ._block_mask import BlockMask, as_block_mask
from ._trace import trace


def _cpp_mask(block_mask: Any, query: Any) -> Any:
    """The library's BlockMask for the call; sdpa.Error when the B or H it was built for
    (1 broadcasts) differs from the query's."""
    mask = as_block_mask(block_mask)
    if mask is None:
        return None
    shape = tuple(query.shape)
    batch, heads = (shape[0], shape[1]) if len(shape) == 4 else (1, shape[0])
    B, H = mask.shape[:2]
    if B not in (1, batch) or H not in (1, heads):
        raise _C.Error(f"block_mask: built for B={B}, H={H}; the query has B={batch}, "
                       f"H={heads} (1 broadcasts)")
    return mask._cpp


class AuxRequest(NamedTuple):
    """Which auxiliary outputs :func:`flex_attention` returns (torch 2.15's AuxRequest):
    ``lse`` (the logsumexp of each query row) and ``max_scores`` (each row's largest
    score after score_mod and masking)."""

    lse: bool = False
    max_scores: bool = False


class AuxOutput(NamedTuple):
    """The auxiliary outputs :func:`flex_attention` returns for ``return_aux``: lse and
    max_scores, float32 [B, Hq, L] each (natural units), or None where not requested."""

    lse: Any = None
    max_scores: Any = None


def flex_attention(query: Any, key: Any, value: Any, score_mod: Optional[Callable] = None,
                   block_mask: Optional[BlockMask] = None, scale: Optional[float] = None,
                   enable_gqa: bool = False, return_lse: bool = False,
                   kernel_options: Any = None, *, return_aux: Any = None) -> Any:
    """torch.nn.attention.flex_attention on the CPU: softmax(score_mod(q k^T * scale)) v
    over the elements ``block_mask`` keeps (full blocks, and partial blocks where its
    mask_mod is true), for any framework with __dlpack__.

    query [B, Hq, L, E], key [B, Hkv, S, E], value [B, Hkv, S, Ev] (float32, float64,
    float16 or bfloat16; Hq a multiple of Hkv with enable_gqa). score_mod(score, b, h,
    q_idx, kv_idx) is traced once per call (compiled forms are cached by structure);
    block_mask is an sdpa.BlockMask or a torch BlockMask (rebuilt from its mask_mod).
    scale defaults to 1/sqrt(E). Returns out [B, Hq, L, Ev] in the query's framework and
    dtype, with return_lse also lse float32 [B, Hq, L] (natural log, as torch). Rows with
    no kept element give 0 (lse -inf). torch inputs get autograd: q, k, v and every
    captured torch tensor that requires grad (a learnable bias table, a 0-d scale).
    ``kernel_options`` is accepted for torch compatibility and ignored.

    ``return_aux`` (an :class:`AuxRequest`, or torch's) returns ``(out, AuxOutput(lse,
    max_scores))`` instead, as torch 2.15 does; lse is included when either it or
    return_lse asks. max_scores [B, Hq, L] float32 is the row maximum of the scores the
    softmax sees (-inf for rows with no kept element), computed by a separate pass over
    q k^T (about half a MATH forward), without gradient; torch raises
    NotImplementedError for it on the CPU.

    Raises TypeError for an untraceable score_mod or a non-array input, sdpa.Error for
    invalid shapes or dtypes, a block_mask of other sizes, or a captured read out of range
    (naming the tensor, index and position).
    """
    program, sources = trace(score_mod, is_mask=False) if score_mod is not None else (None, {})
    cpp_mask = _cpp_mask(block_mask, query)
    if _convert.is_torch_tensor(query):
        from ..torch import _flex_autograd

        out, lse = _flex_autograd(query, key, value, program, cpp_mask, scale, enable_gqa,
                                  sources)
    else:
        out, lse, _ = _C.flex_attention(query, key, value, program, cpp_mask, scale,
                                        enable_gqa)
        out, lse = _convert.like(out, query), _convert.like(lse, query)
    if return_aux is None:
        return (out, lse) if return_lse else out
    max_scores = None
    if getattr(return_aux, "max_scores", False):
        q, k, v = (t.detach() if _convert.is_torch_tensor(t) else t for t in (query, key, value))
        max_scores = _convert.like(
            _C.flex_max_scores(q, k, v, program, cpp_mask, scale, enable_gqa), query)
    wants_lse = return_lse or bool(getattr(return_aux, "lse", False))
    return out, AuxOutput(lse if wants_lse else None, max_scores)


def flex_attention_backward(grad_out: Any, query: Any, key: Any, value: Any, out: Any,
                            lse: Any, score_mod: Optional[Callable] = None,
                            block_mask: Optional[BlockMask] = None,
                            scale: Optional[float] = None, enable_gqa: bool = False) -> tuple:
    """Gradients of :func:`flex_attention` for any framework (torch users get them from
    autograd instead). grad_out [B, Hq, L, Ev] and out / lse from the forward with the
    same arguments. Returns (grad_q, grad_k, grad_v, grads) in the query's framework,
    where grads has one entry per tensor the score_mod captured, in capture order: its
    gradient (same shape) when captured with requires_grad, else None.
    d(score_mod)/d(score) is derived symbolically from the traced program.

    Raises sdpa.Error when the score_mod's result does not depend differentiably on score
    (it ignores score, or score reaches it only through comparisons), and as forward.
    """
    program = trace(score_mod, is_mask=False)[0] if score_mod is not None else None
    cpp_mask = _cpp_mask(block_mask, query)
    gq, gk, gv, captured = _C.flex_attention_backward(grad_out, query, key, value, out, lse,
                                                      program, cpp_mask, scale, enable_gqa)

    def like(t: Any) -> Any:
        return None if t is None else _convert.like(t, query)
    return like(gq), like(gk), like(gv), [like(t) for t in captured]
