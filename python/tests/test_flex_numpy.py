"""sdpa.flex with numpy only (no torch): values vs a float64 dense reference, gradients vs
finite differences, BlockMask fields / text / rendering, errors."""

import math

import numpy as np
import pytest

import sdpa
from sdpa import flex


def dense_reference(q, k, v, score, keep, scale):
    """float64 (out, lse) of softmax(score(q k^T * scale) masked by keep) v, k / v heads
    repeated for GQA; fully masked rows give out 0 and lse -inf."""
    group = q.shape[1] // k.shape[1]
    k, v = (np.repeat(t.astype(np.float64), group, axis=1) for t in (k, v))
    s = np.einsum("bhle,bhse->bhls", q.astype(np.float64), k) * scale
    s = np.where(keep, score(s), -np.inf)
    m = s.max(-1, keepdims=True)
    finite = np.isfinite(m)
    p = np.where(finite, np.exp(s - np.where(finite, m, 0)), 0.0)
    denom = p.sum(-1, keepdims=True)
    out = np.divide(p, denom, out=np.zeros_like(p), where=denom > 0) @ v
    with np.errstate(divide="ignore"):
        lse = np.where(finite, m + np.log(denom), -np.inf)[..., 0]
    return out, lse


def test_alibi_and_window_match_dense_reference(rng):
    B, H, L, S, E = 2, 3, 70, 93, 24
    q, k, v = (rng.standard_normal((B, H, n, E)).astype(np.float32) for n in (L, S, S))
    slopes = np.array([0.5, 0.25, 0.125], np.float32)
    captured = flex.capture(slopes, "slopes")
    window = 17

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - captured[h] * abs(q_idx - kv_idx)

    mask = flex.create_block_mask(flex.sliding_window(window), B, None, L, S, BLOCK_SIZE=16)
    out = sdpa.flex_attention(q, k, v, score_mod=score_mod, block_mask=mask)
    assert isinstance(out, np.ndarray) and out.shape == (B, H, L, E) and out.dtype == np.float32
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    keep = (i >= j) & (i - j <= window)
    bias = -slopes[None, :, None, None] * np.abs(i - j)[None, None].astype(np.float64)
    want, _ = dense_reference(q, k, v, lambda s: s + bias, keep, 1 / math.sqrt(E))
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_numpy_mods_with_closure_arrays_gqa_and_lse_match_dense_reference(rng):
    B, Hq, Hkv, L, E = 2, 4, 2, 77, 16
    q = rng.standard_normal((B, Hq, L, E))
    k, v = (rng.standard_normal((B, Hkv, L, E)) for _ in range(2))
    doc = np.repeat(np.arange(4), [30, 1, 26, 20])  # a one-token document; rows alone
    head_scale = np.array([1.0, 0.5, 2.0, 0.25])

    def score_mod(score, b, h, q_idx, kv_idx):
        return np.where(q_idx >= kv_idx, score * head_scale[h], np.tanh(score) - 1.0)

    def same_doc(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx != kv_idx) | (b == 1) & (kv_idx < 5)

    bm = sdpa.create_block_mask(same_doc, B, None, L, L, BLOCK_SIZE=8)
    out, lse = sdpa.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, scale=0.3,
                                   enable_gqa=True, return_lse=True)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    keep = ((doc[i] == doc[j]) & (i != j))[None, None] | (
        (np.arange(B) == 1)[:, None, None, None] & (j < 5)[None, None])
    hs = head_scale[None, :, None, None]
    want, want_lse = dense_reference(
        q, k, v, lambda s: np.where(i >= j, s * hs, np.tanh(s) - 1.0), keep, 0.3)
    assert np.isneginf(want_lse[0, :, 30]).all() and (want[0, :, 30] == 0).all()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-6, atol=1e-6)


def finite_difference(loss, x, idx, eps=1e-6):
    plus, minus = x.copy(), x.copy()
    plus[idx] += eps
    minus[idx] -= eps
    return (loss(plus) - loss(minus)) / (2 * eps)


def test_backward_matches_finite_differences(rng):
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

    for idx in [(0, 0, 0, 0), (0, 1, 5, 3), (0, 1, 8, 7)]:
        assert gq[idx] == pytest.approx(finite_difference(loss, q, idx), rel=1e-5, abs=1e-8)


def test_captured_table_gradient_matches_finite_differences(rng):
    B, H, L, S, E = 1, 2, 10, 12, 8
    q, k, v = (rng.standard_normal((B, H, n, E)) for n in (L, S, S))
    table = rng.standard_normal((H, L + S))

    def mods(t):
        score_mod = flex.relative_position(t, S, requires_grad=True)
        return score_mod, sdpa.create_block_mask(flex.causal_mask, 1, 1, L, S, BLOCK_SIZE=4)

    score_mod, bm = mods(table)
    out, lse = sdpa.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=True)
    dout = rng.standard_normal(out.shape)
    _, _, _, (gtable,) = flex.flex_attention_backward(dout, q, k, v, out, lse, score_mod, bm)
    assert gtable.shape == table.shape

    def loss(t):
        s, m = mods(t)
        return float((sdpa.flex_attention(q, k, v, score_mod=s, block_mask=m) * dout).sum())

    for idx in [(0, S), (1, S + 3), (0, S - 1), (1, 0)]:  # diagonal, below, above (unused)
        assert gtable[idx] == pytest.approx(finite_difference(loss, table, idx), rel=1e-5,
                                            abs=1e-9)
    assert gtable[1, 0] == 0.0  # q_idx - kv_idx = -S never happens under the causal mask


def block_classes(mask_mod, L, S, block):
    """Per (q block, kv block): 'full', 'empty' or 'partial', from the dense mask."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    dense = np.broadcast_to(mask_mod(0, 0, i, j), (L, S))
    out = {}
    for qb in range(-(-L // block)):
        for kb in range(-(-S // block)):
            tile = dense[qb * block:(qb + 1) * block, kb * block:(kb + 1) * block]
            out[qb, kb] = "full" if tile.all() else "empty" if not tile.any() else "partial"
    return out


def test_block_mask_fields_follow_the_dense_mask():
    doc = np.repeat(np.arange(5), [40, 3, 50, 7, 30])
    L, S, block = 130, 130, 16
    mask_mod = sdpa.and_masks(flex.document(doc), flex.causal_mask)
    bm = sdpa.create_block_mask(mask_mod, None, None, L, S, BLOCK_SIZE=block)
    nq = nkv = 9
    assert bm.shape == (1, 1, L, S) and bm.BLOCK_SIZE == (block, block)
    assert bm.seq_lengths == (L, S) and bm.mask_mod is mask_mod
    assert bm.kv_num_blocks.shape == (1, 1, nq) and bm.kv_indices.shape == (1, 1, nq, nkv)
    assert bm.q_num_blocks.shape == (1, 1, nkv) and bm.q_indices.shape == (1, 1, nkv, nq)
    assert all(getattr(bm, f).dtype == np.int32 for f in flex.BlockMask._FIELDS)
    want = block_classes(lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j), L, S, block)
    dense = bm.to_dense()[0, 0]
    for (qb, kb), cls in want.items():
        # Full blocks skip the mask_mod and empty ones are never computed, so each must be
        # exactly that; the library decides every block of this mask exactly.
        assert dense[qb, kb] == {"empty": 0, "partial": 1, "full": 2}[cls], (qb, kb)
    for prefix, value in (("", 1), ("full_", 2)):
        kv_num, kv_idx = (getattr(bm, f"{prefix}kv_{f}") for f in ("num_blocks", "indices"))
        q_num, q_idx = (getattr(bm, f"{prefix}q_{f}") for f in ("num_blocks", "indices"))
        for qb in range(nq):
            row = kv_idx[0, 0, qb, :kv_num[0, 0, qb]]
            assert row.tolist() == sorted(np.nonzero(dense[qb] == value)[0].tolist())
        for kb in range(nkv):
            col = q_idx[0, 0, kb, :q_num[0, 0, kb]]
            assert col.tolist() == sorted(np.nonzero(dense[:, kb] == value)[0].tolist())
    computed = (dense > 0).sum()
    assert bm.sparsity() == pytest.approx(100 * (1 - computed / (nq * nkv)))
    text = str(bm)
    assert "+" in text and "#" in text and "." in text and "sparsity" in text
    assert repr(bm).startswith("BlockMask(shape=(1, 1, 130, 130), BLOCK_SIZE=(16, 16)")


def test_block_mask_combinators_and_batch_head_dependence():
    every = sdpa.create_block_mask(sdpa.or_masks(flex.causal_mask, sdpa.noop_mask), 1, 1, 64, 64,
                                   BLOCK_SIZE=16)
    assert every.sparsity() == 0.0 and (every.to_dense() == 2).all()
    nothing = sdpa.create_block_mask(sdpa.or_masks(), 1, 1, 64, 64, BLOCK_SIZE=16)
    assert nothing.sparsity() == 100.0
    assert sdpa.and_masks() is sdpa.noop_mask
    per_head = sdpa.create_block_mask(lambda b, h, q, kv: (q >= kv) | (h == 1) & (b == 0),
                                      2, 3, 32, 32, BLOCK_SIZE=(8, 8))
    dense = per_head.to_dense()
    assert dense.shape == (2, 3, 4, 4)
    assert (dense[0, 1] == 2).all() and (dense[1, 1] == dense[0, 0]).all()
    assert (np.triu(dense[0, 0], 1) == 0).all() and (np.diag(dense[0, 0]) == 1).all()
    with pytest.raises(TypeError, match="not a mask_mod"):
        sdpa.and_masks(flex.causal_mask, 3)


def test_block_mask_png(tmp_path):
    pytest.importorskip("matplotlib")
    bm = sdpa.create_block_mask(flex.sliding_window(40), 1, 2, 256, 256, BLOCK_SIZE=32)
    path = tmp_path / "mask.png"
    bm.to_png(str(path), h=1)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The mask ignores h: the library keeps one head, the fields broadcast to H=2.
    assert bm.kv_num_blocks.shape == (1, 2, 8) and bm.to_dense().shape == (1, 2, 8, 8)
    assert bm.to_string(0, 1) == str(bm)
    with pytest.raises(IndexError, match="outside B=1, H=2"):
        bm.to_string(0, 2)
    ax = bm.plot()
    image = ax.images[0].get_array()
    np.testing.assert_array_equal(image, bm.to_dense()[0, 0] / 2.0)


def test_standard_mods_match_their_definitions(rng):
    L, E = 40, 8
    q, k, v = (rng.standard_normal((1, 2, L, E)) for _ in range(3))
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    doc = np.repeat(np.arange(3), [10, 20, 10])
    slopes = np.array([0.5, 0.125])
    table = rng.standard_normal((2, 2 * L + 1))
    none = np.ones((L, L), bool)
    cases = [
        (None, flex.causal_mask, lambda s: s, i >= j),
        (None, flex.sliding_window(5), lambda s: s, (i >= j) & (i - j <= 5)),
        (None, flex.prefix_lm(7), lambda s: s, (j < 7) | (i >= j)),
        (None, flex.document(doc), lambda s: s, doc[i] == doc[j]),
        (flex.alibi(slopes), None, lambda s: s - slopes[:, None, None] * np.abs(i - j), none),
        (flex.relative_position(table, L), None, lambda s: s + table[:, i - j + L], none),
        (flex.soft_cap(2.0), None, lambda s: 2.0 * np.tanh(s / 2.0), none),
    ]
    for score_mod, mask_mod, score, keep in cases:
        bm = mask_mod and sdpa.create_block_mask(mask_mod, 1, 1, L, L, BLOCK_SIZE=8)
        got = sdpa.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
        want, _ = dense_reference(q, k, v, score, keep, 1 / math.sqrt(E))
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for bad in (lambda: flex.sliding_window(-1), lambda: flex.prefix_lm(-2),
                lambda: flex.soft_cap(0.0)):
        with pytest.raises(ValueError):
            bad()


def test_errors(rng):
    q = rng.standard_normal((1, 1, 4, 8)).astype(np.float32)
    short = flex.capture(np.zeros(3, np.float32), "short_table")
    with pytest.raises(sdpa.Error, match="short_table"):
        sdpa.flex_attention(q, q, q, score_mod=lambda s, b, h, qi, ki: s + short[qi])
    with pytest.raises(sdpa.Error, match="index 3"):
        sdpa.create_block_mask(lambda b, h, qi, ki: short[qi] >= 0, 1, 1, 4, 4)
    with pytest.raises(TypeError, match="cannot branch"):
        sdpa.flex_attention(q, q, q, score_mod=lambda s, b, h, qi, ki: s if qi > ki else -s)
    with pytest.raises(sdpa.Error, match="block_mask"):
        bm = sdpa.create_block_mask(flex.causal_mask, 1, 1, 8, 8)
        sdpa.flex_attention(q, q, q, block_mask=bm)
    with pytest.raises(TypeError, match="block_mask: expected an sdpa.BlockMask"):
        sdpa.flex_attention(q, q, q, block_mask=np.ones((4, 4), bool))
    with pytest.raises(TypeError, match="key"):
        sdpa.flex_attention(q, [[1.0]], q)
    with pytest.raises(ValueError, match="pair"):
        sdpa.create_block_mask(flex.causal_mask, 1, 1, 8, 8, BLOCK_SIZE=(4, 8, 2))
    with pytest.raises(sdpa.Error, match="BLOCK_SIZE"):
        sdpa.create_block_mask(flex.causal_mask, 1, 1, 8, 8, BLOCK_SIZE=0)
    with pytest.raises(sdpa.Error, match=r"BLOCK_SIZE >= 1, got \(4, 0\)"):
        sdpa.create_block_mask(flex.causal_mask, 1, 1, 8, 8, BLOCK_SIZE=(4, 0))
    with pytest.raises(sdpa.Error, match="built for B=2, H=1"):
        bm = sdpa.create_block_mask(flex.causal_mask, 2, None, 4, 4)
        q3 = np.concatenate([q] * 3)
        sdpa.flex_attention(q3, q3, q3, block_mask=bm)
    with pytest.raises(sdpa.Error, match="B >= 1"):
        sdpa.create_block_mask(flex.causal_mask, 0, 1, 8, 8)
