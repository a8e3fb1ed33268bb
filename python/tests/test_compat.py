"""sdpa.compat.flash_attn and sdpa.compat.xformers against float64 references written
from flash-attn's and xFormers' documented semantics (BSHD / BMHK layouts, causal aligned
bottom-right for flash-attn and top-left for LowerTriangularMask, packed block-diagonal
sequences, GQA through BMGHK), numpy and torch (with autograd), and the arguments they
refuse."""

import numpy as np
import pytest

import sdpa
import sdpa.compat.flash_attn as fa
import sdpa.compat.xformers as xops
from attention_reference import causal_keep, forward, tolerance


def _bhsd(x):
    """[B, S, H, E] -> [B, H, S, E] float64."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).astype(np.float64)


def _window_keep(L, S, left, right):
    i = np.arange(L)[:, None] + S - L
    j = np.arange(S)[None, :]
    return ((j >= i - left) | (left < 0)) & ((j <= i + right) | (right < 0))


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (4, 1))])
def test_flash_attn_func_matches_reference(rng, causal, window):
    B, Sq, Sk, Hq, Hkv, E = 2, 37, 65, 6, 2, 24
    q = rng.standard_normal((B, Sq, Hq, E)).astype(np.float32)
    k = rng.standard_normal((B, Sk, Hkv, E)).astype(np.float32)
    v = rng.standard_normal((B, Sk, Hkv, E)).astype(np.float32)
    out, lse, probs = fa.flash_attn_func(q, k, v, causal=causal, window_size=window,
                                         return_attn_probs=True)
    keep = causal_keep(Sq, Sk, lower_right=True) if causal else _window_keep(Sq, Sk, *window)
    want, want_lse, _ = forward(_bhsd(q), _bhsd(k), _bhsd(v), mask=keep, enable_gqa=True)
    assert out.shape == (B, Sq, Hq, E) and lse.shape == (B, Hq, Sq) and probs is None
    np.testing.assert_allclose(out.transpose(0, 2, 1, 3), want, **tolerance(np.float32))
    np.testing.assert_allclose(lse, want_lse, atol=1e-4)


def test_packed_forms_and_varlen_agree_with_flash_attn_func(rng):
    B, S, H, E = 3, 20, 2, 16
    qkv = rng.standard_normal((B, S, 3, H, E)).astype(np.float32)
    want = fa.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    np.testing.assert_allclose(fa.flash_attn_qkvpacked_func(qkv, causal=True), want, rtol=0,
                               atol=0)
    np.testing.assert_allclose(fa.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:],
                                                           causal=True), want, rtol=0, atol=0)
    cu = np.arange(0, (B + 1) * S, S, dtype=np.int32)
    packed = [np.ascontiguousarray(qkv[:, :, i].reshape(B * S, H, E)) for i in range(3)]
    got = fa.flash_attn_varlen_func(*packed, cu, cu, S, S, causal=True)
    np.testing.assert_allclose(got.reshape(B, S, H, E), want, rtol=0, atol=0)


def test_flash_attn_with_kvcache_defaults_to_interleaved_rotary(rng):
    B, S_max, H, E = 1, 32, 2, 8
    q = rng.standard_normal((B, 1, H, E)).astype(np.float32)
    k_cache = rng.standard_normal((B, S_max, H, E)).astype(np.float32)
    v_cache = rng.standard_normal((B, S_max, H, E)).astype(np.float32)
    cos = rng.standard_normal((S_max, E // 2)).astype(np.float32)
    sin = rng.standard_normal((S_max, E // 2)).astype(np.float32)
    seqlens = np.array([9], np.int32)
    got = fa.flash_attn_with_kvcache(q, k_cache.copy(), v_cache.copy(), rotary_cos=cos,
                                     rotary_sin=sin, cache_seqlens=seqlens, causal=True)
    want = sdpa.attention_with_kvcache(q, k_cache.copy(), v_cache.copy(), seqlens,
                                       rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True,
                                       causal=True)
    np.testing.assert_array_equal(got, want)
    full = fa.flash_attn_with_kvcache(q, k_cache, v_cache)  # no lengths: the whole cache
    ref, _, _ = forward(_bhsd(q), _bhsd(k_cache), _bhsd(v_cache))
    np.testing.assert_allclose(full.transpose(0, 2, 1, 3), ref, **tolerance(np.float32))


def test_flash_attn_refuses_what_it_cannot_run(rng):
    q = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    cu = np.array([0, 4], np.int32)
    with pytest.raises(sdpa.Error, match=r"block_table\[0\]\[0\] = 5 is outside"):
        fa.flash_attn_varlen_func(q[0], q, q, cu, cu, 4, 4,
                                  block_table=np.full((1, 1), 5, np.int32))
    with pytest.raises(sdpa.Error, match="cache_seqlens: expected the cache lengths"):
        fa.flash_attn_with_kvcache(q, q, q, k=q[:, :1], v=q[:, :1])


def test_flash_attn_func_caps_then_adds_alibi(rng):
    """flash-attn's order with both: cap * tanh(s / cap), then -slope * |i + S - L - j|."""
    B, Sq, Sk, H, E, cap = 2, 5, 9, 2, 8, 2.0
    q, k, v = (rng.standard_normal((B, n, H, E)).astype(np.float32) for n in (Sq, Sk, Sk))
    slopes = np.array([0.5, 0.25])
    got = fa.flash_attn_func(q, k, v, softcap=cap, alibi_slopes=list(slopes))
    scores = _bhsd(q) @ _bhsd(k).transpose(0, 1, 3, 2) / np.sqrt(E)
    distance = np.abs(np.arange(Sq)[:, None] + Sk - Sq - np.arange(Sk)[None, :])
    scores = cap * np.tanh(scores / cap) - slopes[None, :, None, None] * distance
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = (weights / weights.sum(-1, keepdims=True)) @ _bhsd(v)
    np.testing.assert_allclose(got.transpose(0, 2, 1, 3), want, **tolerance(np.float32))


def _packed_dropout_reference(q, k, v, dropout_p, state):
    """flash_attn_func's q/k/v [B, S, H, E] as one packed [1, H, B*S, E] call under a
    block-diagonal mask, dropping with `state`: (out [B, Sq, Hq, Ev], lse [Hq, B*Sq])."""
    B, Sq, Hq, E = q.shape
    Sk = k.shape[1]
    keep = np.zeros((B * Sq, B * Sk), bool)
    for b in range(B):
        keep[b * Sq:(b + 1) * Sq, b * Sk:(b + 1) * Sk] = True
    packed = [np.ascontiguousarray(x.reshape(B * x.shape[1], *x.shape[2:]).transpose(1, 0, 2))
              for x in (q, k, v)]
    r = sdpa.scaled_dot_product_attention_with_lse(*packed, attn_mask=keep,
                                                   dropout_p=dropout_p, enable_gqa=True,
                                                   dropout_state=state)
    out = np.asarray(r.out).transpose(1, 0, 2).reshape(B, Sq, Hq, -1)
    return out, r


def test_flash_attn_func_dropout_with_softcap_is_the_varlen_calls(rng):
    """dropout_p with softcap: the weights attention_varlen drops on the packed sequences
    (tested against flex_attention on the packed tensors in C++), and both act."""
    B, S, H, E = 2, 7, 2, 8
    q, k, v = (rng.standard_normal((B, S, H, E)).astype(np.float32) * 3 for _ in range(3))
    sdpa.manual_seed(5)
    got = fa.flash_attn_func(q, k, v, dropout_p=0.3, softcap=2.0, causal=True)
    cu = np.arange(0, (B + 1) * S, S, dtype=np.int32)
    sdpa.manual_seed(5)
    packed = [x.reshape(B * S, H, E) for x in (q, k, v)]
    want = sdpa.attention_varlen(*packed, cu, cu, S, S, causal=True, softcap=2.0,
                                 dropout_p=0.3)
    np.testing.assert_array_equal(got.reshape(B * S, H, E), want)
    sdpa.manual_seed(5)
    without_cap = fa.flash_attn_func(q, k, v, dropout_p=0.3, softcap=0.0, causal=True)
    assert np.abs(without_cap - got).max() > 0.01


def test_flash_attn_func_dropout_is_the_packed_calls_mask(rng):
    B, Sq, Sk, Hq, Hkv, E = 2, 9, 14, 4, 2, 16
    q = rng.standard_normal((B, Sq, Hq, E)).astype(np.float32)
    k = rng.standard_normal((B, Sk, Hkv, E)).astype(np.float32)
    v = rng.standard_normal((B, Sk, Hkv, E)).astype(np.float32)
    sdpa.manual_seed(11)
    got = fa.flash_attn_func(q, k, v, dropout_p=0.25)
    want, _ = _packed_dropout_reference(q, k, v, 0.25, (11, 0))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # A second call draws the next state (another mask).
    again = fa.flash_attn_func(q, k, v, dropout_p=0.25)
    assert np.abs(again - got).max() > 0.1
    want_next, _ = _packed_dropout_reference(q, k, v, 0.25, (11, 1))
    np.testing.assert_allclose(again, want_next, rtol=1e-5, atol=1e-5)


def test_flash_attn_varlen_dropout_torch_backward_replays_the_mask():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    B, Sq, Sk, Hq, Hkv, E = 2, 5, 8, 4, 2, 16
    q = torch.randn(B, Sq, Hq, E, generator=g, requires_grad=True)
    k = torch.randn(B, Sk, Hkv, E, generator=g, requires_grad=True)
    v = torch.randn(B, Sk, Hkv, E, generator=g, requires_grad=True)
    sdpa.manual_seed(21)
    out = fa.flash_attn_func(q, k, v, dropout_p=0.3)
    grad_out = torch.randn(out.shape, generator=g)
    out.backward(grad_out)
    # The packed call with the same state, and its gradients from sdpa's own backward.
    arrays = [x.detach().numpy() for x in (q, k, v)]
    want, r = _packed_dropout_reference(*arrays, 0.3, (21, 0))
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-5)
    keep = np.zeros((B * Sq, B * Sk), bool)
    for b in range(B):
        keep[b * Sq:(b + 1) * Sq, b * Sk:(b + 1) * Sk] = True
    packed = [np.ascontiguousarray(x.reshape(B * x.shape[1], *x.shape[2:]).transpose(1, 0, 2))
              for x in arrays]
    go = np.ascontiguousarray(grad_out.numpy().reshape(B * Sq, Hq, E).transpose(1, 0, 2))
    grads = sdpa.scaled_dot_product_attention_backward(
        go, *packed, r.out, r.lse, attn_mask=keep, dropout_p=0.3, enable_gqa=True,
        dropout_state=(21, 0))
    for x, gx in zip((q, k, v), (grads.grad_q, grads.grad_k, grads.grad_v)):
        want_grad = np.asarray(gx).transpose(1, 0, 2).reshape(x.shape)
        np.testing.assert_allclose(x.grad.numpy(), want_grad, rtol=1e-4, atol=1e-4)


def test_flash_attn_func_torch_gradients():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, n, 4, 16, generator=g, requires_grad=True) for n in (9, 14, 14))
    fa.flash_attn_func(q, k, v, causal=True, softcap=4.0).square().sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = (q64.transpose(1, 2) @ k64.transpose(1, 2).transpose(-1, -2)) / 4.0
    s = (4.0 * torch.tanh(s / 4.0)).masked_fill(~torch.ones(9, 14, dtype=torch.bool).tril(5),
                                                float("-inf"))
    (s.softmax(-1) @ v64.transpose(1, 2)).transpose(1, 2).square().sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (got.double() - want).abs().max().item() < 1e-4


@pytest.mark.parametrize("mask_name", ["none", "lower", "bottom_right"])
def test_memory_efficient_attention_masks(rng, mask_name):
    B, M, N, H, K = 2, 19, 33, 3, 16
    q = rng.standard_normal((B, M, H, K)).astype(np.float32)
    k = rng.standard_normal((B, N, H, K)).astype(np.float32)
    v = rng.standard_normal((B, N, H, K)).astype(np.float32)
    bias = {"none": None, "lower": xops.LowerTriangularMask(),
            "bottom_right": xops.LowerTriangularFromBottomRightMask()}[mask_name]
    out = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
    keep = None if bias is None else causal_keep(M, N, lower_right=mask_name == "bottom_right")
    want, _, _ = forward(_bhsd(q), _bhsd(k), _bhsd(v), mask=keep)
    assert out.shape == (B, M, H, K) and out.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(out.transpose(0, 2, 1, 3), want, **tolerance(np.float32))
    if bias is not None:
        dense = bias.materialize((M, N))
        np.testing.assert_array_equal(np.isfinite(dense), keep)


def test_block_diagonal_masks_match_per_sequence(rng):
    q_lens, kv_lens, H, K = [3, 10, 1], [5, 10, 7], 2, 8
    q = rng.standard_normal((1, sum(q_lens), H, K)).astype(np.float32)
    k = rng.standard_normal((1, sum(kv_lens), H, K)).astype(np.float32)
    v = rng.standard_normal((1, sum(kv_lens), H, K)).astype(np.float32)
    mask = xops.fmha.attn_bias.BlockDiagonalMask.from_seqlens(q_lens, kv_lens)
    for bias, bottom_right in ((mask, None), (mask.make_causal(), False),
                               (mask.make_causal_from_bottomright(), True)):
        out = xops.memory_efficient_attention(q, k, v, attn_bias=bias)
        q0 = k0 = 0
        for L, S in zip(q_lens, kv_lens):
            keep = None if bottom_right is None else causal_keep(L, S, lower_right=bottom_right)
            want, _, _ = forward(_bhsd(q[:, q0:q0 + L]), _bhsd(k[:, k0:k0 + S]),
                                 _bhsd(v[:, k0:k0 + S]), mask=keep)
            got = out[:, q0:q0 + L].transpose(0, 2, 1, 3)
            rows = np.ones(L, bool) if keep is None else keep.any(axis=1)
            np.testing.assert_allclose(got[:, :, rows], want[:, :, rows], **tolerance(np.float32))
            q0, k0 = q0 + L, k0 + S


def test_bmghk_grouped_query_attention(rng):
    B, M, N, G, H, K = 1, 7, 12, 2, 3, 8
    q = rng.standard_normal((B, M, G, H, K)).astype(np.float32)
    k = np.broadcast_to(rng.standard_normal((B, N, G, 1, K)).astype(np.float32), (B, N, G, H, K))
    v = np.broadcast_to(rng.standard_normal((B, N, G, 1, K)).astype(np.float32), (B, N, G, H, K))
    out = xops.memory_efficient_attention(q, k, v)
    assert out.shape == (B, M, G, H, K)
    want, _, _ = forward(_bhsd(q.reshape(B, M, G * H, K)),
                         _bhsd(np.ascontiguousarray(k).reshape(B, N, G * H, K)),
                         _bhsd(np.ascontiguousarray(v).reshape(B, N, G * H, K)))
    np.testing.assert_allclose(out.reshape(B, M, G * H, K).transpose(0, 2, 1, 3), want,
                               **tolerance(np.float32))


def test_memory_efficient_attention_torch_tensor_bias_and_grad():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 11, 2, 8, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 2, 11, 11, generator=g)
    out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=0.3)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(t.detach().double().transpose(1, 2) for t in (q, k, v)), attn_mask=bias.double(),
        scale=0.3).transpose(1, 2)
    assert (out.double() - want).abs().max().item() < 1e-5
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
