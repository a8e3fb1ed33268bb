"""sdpa.flex.flex_attention on torch CUDA tensors: traced score_mods lowered to cuDNN's
score_mod subgraph (the backward through sdpa's derived score_mod_bprop), checked with
autograd against the same call on float64 CPU copies (sdpa's CPU flex, itself checked
against torch in test_flex.py). Skips, printing why, without a GPU.
"""

from __future__ import annotations

import math

import pytest

import sdpa
from sdpa.flex import flex_attention

torch = pytest.importorskip("torch")

gpu = pytest.mark.skipif(
    not (sdpa.cuda.is_available() and torch.cuda.is_available() and sdpa.cuda.cudnn_is_built()),
    reason=sdpa.cuda.unavailable_reason() or "torch sees no CUDA device, or no cuDNN backend")

# Largest error over the largest reference value: bf16/fp16 outputs round at 2^-8 / 2^-11,
# and gradients chain two more products.
FORWARD_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
GRAD_TOL = {dtype: 2 * tol for dtype, tol in FORWARD_TOL.items()}


def _soft_cap(score, b, h, q_idx, kv_idx):
    return 1.5 * torch.tanh(score / 1.5)


def _causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def _alibi(slopes):
    def mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()
    return mod


def _causal_alibi(slopes):
    def mod(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score - slopes[h] * (q_idx - kv_idx), -float("inf"))
    return mod


def _run(q, k, v, grad_out, score_mod):
    """out and the q/k/v gradients of flex_attention through autograd."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = flex_attention(*leaves, score_mod=score_mod, enable_gqa=True)
    out.backward(grad_out)
    return out.detach(), [x.grad for x in leaves]


def _error(actual, expected):
    expected = expected.double()
    return ((actual.cpu().double() - expected).abs().max()
            / expected.abs().max().clamp_min(1e-30)).item()


@gpu
@pytest.mark.parametrize("dtype", list(FORWARD_TOL), ids=str)
@pytest.mark.parametrize("L,S", [(7, 129), (127, 127), (129, 1000)])
@pytest.mark.parametrize("mod", ["soft_cap", "causal_alibi", "causal"])
def test_score_mods_on_cudnn_match_float64(dtype, L, S, mod):
    heads_q, heads_kv, E = 8, 2, 64
    q = torch.randn(2, heads_q, L, E, device="cuda").to(dtype)
    k = torch.randn(2, heads_kv, S, E, device="cuda").to(dtype)
    v = torch.randn(2, heads_kv, S, E, device="cuda").to(dtype)
    grad_out = torch.randn(2, heads_q, L, E, device="cuda").to(dtype)
    slopes = torch.tensor([2.0 ** (-8 * (i + 1) / heads_q) for i in range(heads_q)])
    gpu_mod, cpu_mod = {
        "soft_cap": (_soft_cap, _soft_cap),
        "causal_alibi": (_causal_alibi(slopes.cuda()), _causal_alibi(slopes.double())),
        "causal": (_causal, _causal),
    }[mod]
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        out, grads = _run(q, k, v, grad_out, gpu_mod)
    assert out.is_cuda and out.dtype == dtype
    expected, expected_grads = _run(*(x.cpu().double() for x in (q, k, v, grad_out)), cpu_mod)
    assert _error(out, expected) <= FORWARD_TOL[dtype]
    scale = max(g.abs().max().item() for g in expected_grads)
    for name, grad, ref in zip("qkv", grads, expected_grads):
        assert grad.is_cuda and grad.dtype == dtype
        assert (grad.cpu().double() - ref).abs().max().item() / scale <= GRAD_TOL[dtype], name


@gpu
def test_alibi_forward_runs_on_cudnn_and_its_backward_is_refused_with_the_reason():
    # cuDNN 9.19 (H200) returned grad_v = 0 for the backward of score_mods that read a
    # captured tensor and end in no mask select: sdpa does not run those on cuDNN.
    q = torch.randn(1, 4, 65, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 4, 129, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        out = flex_attention(q, k, v, score_mod=_alibi(slopes.cuda()))
    expected = flex_attention(*(x.cpu().double() for x in (q, k, v)),
                              score_mod=_alibi(slopes.double()))
    assert _error(out, expected) <= FORWARD_TOL[torch.bfloat16]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        out = flex_attention(*leaves, score_mod=_alibi(slopes.cuda()))
        with pytest.raises(sdpa.Error, match="wrong grad_v"):
            out.sum().backward()


@gpu
def test_explain_names_cudnn_for_a_score_mod_and_the_reason_for_a_gather():
    q = torch.randn(1, 2, 33, 64, device="cuda", dtype=torch.bfloat16)
    out = flex_attention(q, q, q, score_mod=_soft_cap)
    assert out.is_cuda and math.isfinite(out.float().abs().max().item())
    table = torch.randn(2, 65, device="cuda")

    def relative(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + 32]

    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        with pytest.raises(sdpa.Error, match="no gather"):
            flex_attention(q, q, q, score_mod=relative)


@gpu
@pytest.mark.parametrize("dtype", list(FORWARD_TOL), ids=str)
def test_torch_block_masks_on_cuda_flash_match_float64(dtype):
    # sdpa's own CUDA FLASH kernel compiled by NVRTC with the mask_mod (and a score_mod),
    # its tiles skipped by the block lists of torch's create_block_mask.
    from torch.nn.attention.flex_attention import create_block_mask

    L, S, E = 257, 300, 64
    doc = torch.arange(S) // 37

    def documents(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    doc_cuda = doc.cuda()
    torch_mask = create_block_mask(
        lambda b, h, q_idx, kv_idx: (doc_cuda[q_idx] == doc_cuda[kv_idx]) & (q_idx >= kv_idx),
        None, None, L, S, device="cuda", BLOCK_SIZE=(128, 64))
    q = torch.randn(2, 4, L, E, device="cuda").to(dtype)
    k, v = (torch.randn(2, 2, S, E, device="cuda").to(dtype) for _ in range(2))
    for score_mod in (None, _soft_cap):
        with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
            out = flex_attention(q, k, v, score_mod=score_mod, block_mask=torch_mask,
                                 enable_gqa=True)
        cpu_mask = sdpa.flex.create_block_mask(documents, None, None, L, S, BLOCK_SIZE=(128, 64))
        expected = flex_attention(*(x.cpu().double() for x in (q, k, v)), score_mod=score_mod,
                                  block_mask=cpu_mask, enable_gqa=True)
        assert out.is_cuda and out.dtype == dtype
        assert _error(out, expected) <= FORWARD_TOL[dtype]


@gpu
@pytest.mark.parametrize("window", [None, 48])
@pytest.mark.parametrize("score_mod", [None, _soft_cap], ids=["plain", "soft_cap"])
def test_torch_block_masks_of_bands_run_on_cudnn_with_autograd(window, score_mod):
    # A mask_mod that is a band of q_idx - kv_idx reaches cuDNN (its native band, or the
    # score_mod subgraph beside a score_mod), torch's block lists checked to follow it.
    from torch.nn.attention.flex_attention import create_block_mask

    def band(b, h, q_idx, kv_idx):
        keep = q_idx >= kv_idx
        return keep if window is None else keep & (q_idx - kv_idx <= window)

    L, S, E, dtype = 200, 257, 64, torch.bfloat16
    torch_mask = create_block_mask(band, None, None, L, S, device="cuda", BLOCK_SIZE=(128, 64))
    q = torch.randn(2, 4, L, E, device="cuda").to(dtype)
    k, v = (torch.randn(2, 2, S, E, device="cuda").to(dtype) for _ in range(2))
    grad_out = torch.randn(2, 4, L, E, device="cuda").to(dtype)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        out = flex_attention(*leaves, score_mod=score_mod, block_mask=torch_mask,
                             enable_gqa=True)
        out.backward(grad_out)
    cpu_mask = sdpa.flex.create_block_mask(band, None, None, L, S, BLOCK_SIZE=(128, 64))
    cpu = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    expected = flex_attention(*cpu, score_mod=score_mod, block_mask=cpu_mask, enable_gqa=True)
    expected.backward(grad_out.cpu().double())
    assert _error(out, expected.detach()) <= FORWARD_TOL[dtype]
    scale = max(x.grad.abs().max().item() for x in cpu)
    for name, leaf, ref in zip("qkv", leaves, cpu):
        assert (leaf.grad.cpu().double() - ref.grad).abs().max().item() / scale <= GRAD_TOL[dtype], name


@gpu
def test_a_gather_score_mod_runs_on_cuda_math_with_autograd():
    # cuDNN's score_mod has no gather: MATH on CUDA interprets the program, forward and
    # backward, against the float64 CPU call.
    table = torch.randn(2, 41)

    def relative(tab):
        def mod(score, b, h, q_idx, kv_idx):
            return score + tab[h % 2, (q_idx - kv_idx).clamp(-20, 20) + 20]
        return mod

    q = torch.randn(1, 4, 33, 32, device="cuda", dtype=torch.float32)
    k, v = (torch.randn(1, 4, 47, 32, device="cuda", dtype=torch.float32) for _ in range(2))
    grad_out = torch.randn(1, 4, 33, 32, device="cuda", dtype=torch.float32)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
        out, grads = _run(q, k, v, grad_out, relative(table.cuda()))
    expected, expected_grads = _run(*(x.cpu().double() for x in (q, k, v, grad_out)),
                                    relative(table.double()))
    assert out.is_cuda
    assert _error(out, expected) <= 1e-5
    for grad, ref in zip(grads, expected_grads):
        assert _error(grad, ref) <= 1e-5
