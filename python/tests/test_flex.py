"""sdpa.flex: Python score_mod / mask_mod traced into the C++ programs.

numpy tests need no torch; torch tests compare with torch.nn.attention.flex_attention run
eagerly on CPU (forward) and with a float64 dense reference through torch autograd
(gradients of q, k, v and of a learnable relative-position table)."""

import math
import os

import numpy as np
import pytest

import sdpa
from sdpa import flex

# ---- numpy: no torch needed -------------------------------------------------------------


def dense_reference(q, k, v, score, keep, scale):
    """float64 softmax(score(q k^T * scale) masked by keep) v; fully masked rows give 0."""
    s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k.astype(np.float64)) * scale
    s = score(s)
    s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(np.isfinite(m), np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    denom = p.sum(-1, keepdims=True)
    p = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0)
    return p @ v.astype(np.float64)


def test_numpy_alibi_and_window_match_dense_reference(rng):
    B, H, L, S, E = 2, 3, 70, 93, 24
    q, k, v = (rng.standard_normal((B, H, n, E)).astype(np.float32) for n in (L, S, S))
    slopes = np.array([0.5, 0.25, 0.125], np.float32)
    captured = flex.capture(slopes, "slopes")
    window = 17

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - captured[h] * abs(q_idx - kv_idx)

    mask = flex.create_block_mask(flex.sliding_window(window), B, None, L, S, BLOCK_SIZE=16)
    out = sdpa.flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)
    assert isinstance(out, np.ndarray) and out.shape == (B, H, L, E)
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    keep = (i >= j) & (i - j <= window)
    bias = -slopes[None, :, None, None] * np.abs(i - j)[None, None].astype(np.float64)
    want = dense_reference(q, k, v, lambda s: s + bias, keep, 1 / math.sqrt(E))
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_numpy_backward_matches_finite_differences(rng):
    B, H, L, S, E = 1, 2, 9, 11, 8
    q, k, v = (rng.standard_normal((B, H, n, E)) for n in (L, S, S))
    cap = 3.0

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * (score / cap).tanh()

    out, lse = sdpa.flex_attention(q, k, v, score_mod=score_mod, return_lse=True)
    dout = rng.standard_normal(out.shape)
    gq, gk, gv, captured = flex.flex_attention_backward(dout, q, k, v, out, lse, score_mod)
    assert captured == []

    def loss(qq):
        return float((sdpa.flex_attention(qq, k, v, score_mod=score_mod) * dout).sum())

    eps = 1e-6
    for idx in [(0, 0, 0, 0), (0, 1, 5, 3), (0, 1, 8, 7)]:
        plus, minus = q.copy(), q.copy()
        plus[idx] += eps
        minus[idx] -= eps
        assert gq[idx] == pytest.approx((loss(plus) - loss(minus)) / (2 * eps), rel=1e-5, abs=1e-8)


def test_block_mask_fields_text_and_combinators():
    doc = np.repeat(np.arange(4), 32).astype(np.int64)  # 4 documents of 32
    mask_mod = sdpa.and_masks(flex.document(doc), flex.causal_mask)
    bm = sdpa.create_block_mask(mask_mod, 1, 1, 128, 128, BLOCK_SIZE=16)
    assert bm.kv_num_blocks.shape == (1, 1, 8) and bm.kv_indices.shape == (1, 1, 8, 8)
    # Diagonal blocks are partial (causal inside), the block below each diagonal one full.
    assert bm.kv_num_blocks[0, 0].tolist() == [1] * 8
    assert bm.kv_indices[0, 0, :, 0].tolist() == list(range(8))
    assert bm.full_kv_num_blocks[0, 0].tolist() == [0, 1] * 4
    assert bm.q_num_blocks[0, 0].tolist() == [1] * 8
    text = str(bm)
    assert "+" in text and "#" in text and "sparsity" in text
    assert bm.sparsity() == pytest.approx(100 * (1 - 12 / 64))
    every = sdpa.create_block_mask(sdpa.or_masks(flex.causal_mask, sdpa.noop_mask), 1, 1, 64, 64,
                                   BLOCK_SIZE=16)
    assert every.sparsity() == 0.0


def test_block_mask_png(tmp_path):
    pytest.importorskip("matplotlib")
    bm = sdpa.create_block_mask(flex.causal_mask, 1, 1, 256, 256, BLOCK_SIZE=32)
    path = tmp_path / "mask.png"
    bm.to_png(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_untraceable_mods_raise_clear_errors(rng):
    q = rng.standard_normal((1, 1, 4, 8)).astype(np.float32)

    def branching(score, b, h, q_idx, kv_idx):
        return score if q_idx > kv_idx else -score

    with pytest.raises(TypeError, match="cannot branch"):
        sdpa.flex_attention(q, q, q, score_mod=branching)
    table = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match="capture"):
        sdpa.flex_attention(q, q, q, score_mod=lambda s, b, h, qi, ki: s + table[qi])
    short = flex.capture(np.zeros(3, np.float32), "short_table")
    with pytest.raises(sdpa.Error, match="short_table"):
        sdpa.flex_attention(q, q, q, score_mod=lambda s, b, h, qi, ki: s + short[qi])
    with pytest.raises(sdpa.Error, match="index 3"):
        sdpa.create_block_mask(lambda b, h, qi, ki: short[qi] >= 0, 1, 1, 4, 4)
    with pytest.raises(TypeError, match="2 dimensions, indexed with 3"):
        t2 = flex.capture(np.zeros((2, 2), np.float32))
        sdpa.flex_attention(q, q, q, score_mod=lambda s, b, h, qi, ki: s + t2[h, qi, ki])


# ---- torch: parity with torch.nn.attention.flex_attention ------------------------------

torch_required = os.environ.get("SDPA_TESTS_REQUIRE_TORCH") == "1"


def _torch():
    if torch_required:
        import torch
        return torch
    return pytest.importorskip("torch")


@pytest.fixture
def torch_flex():
    torch = _torch()
    from torch.nn.attention import flex_attention as tf

    return torch, tf


def example_mods(torch, H):
    slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32))
    doc = torch.repeat_interleave(torch.arange(5), 20)[:93]
    rel = torch.randn(H, 2 * 93 + 1, generator=torch.Generator().manual_seed(3))

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def softcap(score, b, h, q_idx, kv_idx):
        return 20.0 * torch.tanh(score / 20.0)

    def relative(score, b, h, q_idx, kv_idx):
        return score + rel[h, q_idx - kv_idx + 93]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= 24)

    def prefix(b, h, q_idx, kv_idx):
        return (kv_idx <= 10) | (q_idx >= kv_idx)

    def document(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    def where_mod(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score, score - 3.0)

    score_mods = {"none": None, "alibi": alibi, "softcap": softcap, "relative": relative,
                  "where": where_mod}
    mask_mods = {"none": None, "causal": causal, "window": window, "prefix": prefix,
                 "document": document}
    return score_mods, mask_mods


@pytest.mark.parametrize("score_name", ["none", "alibi", "softcap", "relative", "where"])
@pytest.mark.parametrize("mask_name", ["none", "causal", "window", "prefix", "document"])
def test_forward_matches_torch_flex_attention(torch_flex, score_name, mask_name):
    torch, tf = torch_flex
    B, Hq, Hkv, L, S, E = 2, 4, 2, 93, 93, 24
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, Hq, L, E, generator=g)
    k = torch.randn(B, Hkv, S, E, generator=g)
    v = torch.randn(B, Hkv, S, E, generator=g)
    score_mods, mask_mods = example_mods(torch, Hq)
    score_mod, mask_mod = score_mods[score_name], mask_mods[mask_name]
    ours_mask = theirs_mask = None
    if mask_mod is not None:
        ours_mask = sdpa.create_block_mask(mask_mod, None, None, L, S, BLOCK_SIZE=32)
        theirs_mask = tf.create_block_mask(mask_mod, None, None, L, S, device="cpu")
    got = sdpa.flex_attention(q, k, v, score_mod=score_mod, block_mask=ours_mask, enable_gqa=True)
    want = tf.flex_attention(q, k, v, score_mod=score_mod, block_mask=theirs_mask, enable_gqa=True)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_gradients_with_a_learnable_bias_table(torch_flex):
    torch, _ = torch_flex
    B, H, L, S, E = 1, 2, 37, 41, 16
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, H, n, E, generator=g, dtype=torch.float64) for n in (L, S, S))
    table = torch.randn(H, L + S + 1, generator=g, dtype=torch.float64)

    def relative(score, b, h, q_idx, kv_idx):
        return torch.tanh(score) * 2.0 + table[h, q_idx - kv_idx + S]

    def window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx <= 9) & (kv_idx - q_idx <= 20)

    bm = sdpa.create_block_mask(window, None, None, L, S, BLOCK_SIZE=8)
    ours = [t.clone().requires_grad_() for t in (q, k, v, table)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v, table)]
    table = ours[3]
    out = sdpa.flex_attention(*ours[:3], score_mod=relative, block_mask=bm)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out * dout).sum().backward()

    rq, rk, rv, rt = theirs
    i = torch.arange(L)[:, None]
    j = torch.arange(S)[None, :]
    s = rq @ rk.transpose(-1, -2) / math.sqrt(E)
    s = torch.tanh(s) * 2.0 + rt[torch.arange(H)[:, None, None], (i - j + S)[None]]
    s = s.masked_fill(~((i - j <= 9) & (j - i <= 20)), float("-inf"))
    want = torch.softmax(s, -1) @ rv
    (want * dout).sum().backward()
    torch.testing.assert_close(out, want)
    for a, b, name in zip(ours, theirs, ["q", "k", "v", "table"]):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
