"""sdpa.flex with torch: the forward equals torch.nn.attention.flex_attention run eagerly
on CPU (FlexAttention's example mods, GQA, torch's own BlockMask accepted), gradients of
q, k, v and of captured tensors (a learnable bias table, slopes, a 0-d scale) equal torch
autograd through a float64 dense reference. numpy-only flex tests: test_flex_numpy.py;
tracing: test_flex_trace.py."""

import math
import os

import numpy as np
import pytest

import sdpa

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


def test_torch_block_mask_and_lse_match_torch(torch_flex):
    torch, tf = torch_flex
    B, H, L, S, E = 2, 2, 150, 150, 16
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, H, n, E, generator=g) for n in (L, S, S))
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([60, 50, 40]))

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx) | (h == 1) & (kv_idx == 0)

    theirs_mask = tf.create_block_mask(mask_mod, B, H, L, S, device="cpu", BLOCK_SIZE=64)
    want, want_lse = tf.flex_attention(q, k, v, block_mask=theirs_mask, return_lse=True)
    got, lse = sdpa.flex_attention(q, k, v, block_mask=theirs_mask, return_lse=True)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(lse, want_lse, rtol=2e-5, atol=2e-5)


def test_torch_block_masks_from_block_lists_and_non_square_blocks(torch_flex):
    """torch BlockMasks built from block indices alone (kept whole, or with a mask_mod in
    the partial blocks) and with BLOCK_SIZE=(q, kv) give torch's own results."""
    torch, tf = torch_flex
    B, H, L, S, E = 1, 2, 96, 160, 16
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(B, H, n, E, generator=g) for n in (L, S, S))
    # 3 q blocks of 32 by 5 kv blocks of 32; rows list blocks out of order, one none.
    # (torch wants indices as wide as the kv blocks: [B, H, q blocks, kv blocks].)
    counts = torch.tensor([[[2, 0, 3], [1, 1, 1]]], dtype=torch.int32)
    indices = torch.tensor([[[[4, 1, 0, 0, 0], [0, 0, 0, 0, 0], [2, 0, 3, 0, 0]],
                             [[3, 0, 0, 0, 0], [0, 0, 0, 0, 0], [4, 0, 0, 0, 0]]]],
                           dtype=torch.int32)
    full_counts = torch.tensor([[[0, 1, 0], [1, 0, 0]]], dtype=torch.int32)
    full_indices = torch.tensor([[[[0, 0, 0, 0, 0], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]],
                                  [[1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]]],
                                dtype=torch.int32)
    odd = lambda b, h, q_idx, kv_idx: (q_idx + kv_idx) % 3 != 0  # noqa: E731

    def blocks(c, i):  # [B, H, L, S] bool: the listed blocks, element by element
        dense = torch.zeros(B, H, 3, 5, dtype=torch.bool)
        for h in range(H):
            for r in range(3):
                dense[0, h, r, i[0, h, r, :c[0, h, r]].long()] = True
        return dense.repeat_interleave(32, 2).repeat_interleave(32, 3)

    qi, ki = torch.arange(L)[:, None], torch.arange(S)[None, :]
    for mask_mod in (None, odd):
        partial = blocks(counts, indices) & (True if mask_mod is None else odd(0, 0, qi, ki))
        keep = partial | blocks(full_counts, full_indices)
        # torch's compiled kernels honour the block lists this way; its eager path
        # evaluates mask_mod densely and ignores them (docs/semantics.md).
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        theirs = tf.BlockMask.from_kv_blocks(counts, indices, full_counts, full_indices,
                                             BLOCK_SIZE=32, mask_mod=mask_mod,
                                             seq_lengths=(L, S))
        ours = sdpa.flex.BlockMask.from_kv_blocks(counts, indices, full_counts, full_indices,
                                                  BLOCK_SIZE=32, mask_mod=mask_mod,
                                                  seq_lengths=(L, S))
        np.testing.assert_array_equal(ours.to_dense() > 0, theirs.to_dense().numpy() > 0)
        for mask in (theirs, ours):
            torch.testing.assert_close(sdpa.flex_attention(q, k, v, block_mask=mask), want,
                                       rtol=2e-5, atol=2e-5)
    window = lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= 40  # noqa: E731
    for block in ((16, 64), (64, 32)):
        theirs = tf.create_block_mask(window, None, None, L, S, device="cpu", BLOCK_SIZE=block)
        ours = sdpa.create_block_mask(window, None, None, L, S, BLOCK_SIZE=block)
        assert ours.BLOCK_SIZE == block
        # The same blocks are computed (torch counts a block that runs past Q_LEN as
        # partial where sdpa, seeing only real rows, may call it full).
        np.testing.assert_array_equal(ours.to_dense() > 0, theirs.to_dense().numpy() > 0)
        want = tf.flex_attention(q, k, v, block_mask=theirs)
        for mask in (theirs, ours):
            torch.testing.assert_close(sdpa.flex_attention(q, k, v, block_mask=mask), want,
                                       rtol=2e-5, atol=2e-5)


def dense_scores(torch, q, k, score, keep, scale):
    """float64 softmax(score(q k^T * scale) masked by keep), k heads repeated for GQA."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = score(q @ k.transpose(-1, -2) * scale)
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1)


@pytest.mark.parametrize("case", ["alibi_learnable_slopes", "scaled_softcap", "document_where"])
def test_gqa_gradients_with_captured_parameters(torch_flex, case):
    torch, _ = torch_flex
    B, Hq, Hkv, L, E = 2, 4, 2, 45, 8
    g = torch.Generator().manual_seed(13)
    q = torch.randn(B, Hq, L, E, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, L, E, generator=g, dtype=torch.float64) for _ in range(2))
    slopes = torch.rand(Hq, generator=g, dtype=torch.float64)
    alpha = torch.tensor(0.7, dtype=torch.float64)
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([20, 5, 20]))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    hh = torch.arange(Hq)[:, None, None]

    def make(params):
        s, a = params
        if case == "alibi_learnable_slopes":
            return ((lambda score, b, h, q_idx, kv_idx: score + s[h] * (kv_idx - q_idx)),
                    lambda b, h, q_idx, kv_idx: q_idx >= kv_idx,
                    lambda x: x + s[hh] * (j - i), i >= j)
        if case == "scaled_softcap":
            return ((lambda score, b, h, q_idx, kv_idx: a * torch.tanh(score / a)),
                    lambda b, h, q_idx, kv_idx: (q_idx - kv_idx).abs() <= 6,
                    lambda x: a * torch.tanh(x / a), (i - j).abs() <= 6)
        return ((lambda score, b, h, q_idx, kv_idx: torch.where(h < 2, score * a, score - s[h])),
                lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx],
                lambda x: torch.where(hh < 2, x * a, x - s[hh]), doc[i] == doc[j])

    ours = [t.clone().requires_grad_() for t in (q, k, v, slopes, alpha)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v, slopes, alpha)]
    score_mod, mask_mod, _, _ = make(ours[3:])
    bm = sdpa.create_block_mask(mask_mod, None, None, L, L, BLOCK_SIZE=16)
    out = sdpa.flex_attention(*ours[:3], score_mod=score_mod, block_mask=bm, enable_gqa=True,
                              scale=0.4)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out * dout).sum().backward()
    _, _, score, keep = make(theirs[3:])
    want = dense_scores(torch, theirs[0], theirs[1], score, keep, 0.4) @ \
        theirs[2].repeat_interleave(Hq // Hkv, dim=1)
    (want * dout).sum().backward()
    torch.testing.assert_close(out, want)
    for a, b, name in zip(ours, theirs, ["q", "k", "v", "slopes", "alpha"]):
        if b.grad is None:
            assert a.grad is None, name
        else:
            torch.testing.assert_close(a.grad, b.grad, msg=name)
    used = {"alibi_learnable_slopes": (True, False), "scaled_softcap": (False, True),
            "document_where": (True, True)}[case]
    assert (ours[3].grad is not None, ours[4].grad is not None) == used


def more_examples(torch, tf, B, H, L):
    """More mods in the style of FlexAttention's examples (attention-gym), each written as
    torch users write them."""
    g = torch.Generator().manual_seed(9)
    bias = torch.randn(L, L, generator=g)
    prefix_length = torch.tensor([17, 64])
    W = 8  # NATTEN-style 2-D neighbourhood on a 10 x 10 grid (L = 100)

    def exp2_alibi(score, b, h, q_idx, kv_idx):
        return score + torch.exp2(-((h + 1) * 8.0 / H)) * (kv_idx - q_idx)

    def natten(b, h, q_idx, kv_idx):
        qx, qy, kx, ky = q_idx // 10, q_idx % 10, kv_idx // 10, kv_idx % 10
        return ((qx - kx).abs() <= 2) & ((qy - ky).abs() <= 2)

    def prefix_per_batch(b, h, q_idx, kv_idx):
        return (kv_idx <= prefix_length[b]) | (q_idx >= kv_idx)

    def head_dependent(b, h, q_idx, kv_idx):
        return torch.where(h < 2, q_idx >= kv_idx, (q_idx - kv_idx).abs() < W)

    def dense_bias(score, b, h, q_idx, kv_idx):
        return score + bias[q_idx, kv_idx]

    def capped_causal(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, 30 * torch.tanh(score / 30), -float("inf"))

    causal = tf.and_masks(lambda b, h, q, kv: q >= kv, tf.noop_mask)
    return [(exp2_alibi, natten), (dense_bias, prefix_per_batch), (capped_causal, None),
            (exp2_alibi, head_dependent), (None, tf.or_masks(causal, natten))]


def test_more_flexattention_examples_match_torch(torch_flex):
    torch, tf = torch_flex
    B, H, L, E = 2, 4, 100, 16
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(B, H, L, E, generator=g) for _ in range(3))
    for score_mod, mask_mod in more_examples(torch, tf, B, H, L):
        ours_mask = theirs_mask = None
        if mask_mod is not None:
            ours_mask = sdpa.create_block_mask(mask_mod, B, H, L, L, BLOCK_SIZE=16)
            theirs_mask = tf.create_block_mask(mask_mod, B, H, L, L, device="cpu")
        got = sdpa.flex_attention(q, k, v, score_mod=score_mod, block_mask=ours_mask)
        want = tf.flex_attention(q, k, v, score_mod=score_mod, block_mask=theirs_mask)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5,
                                   msg=f"{score_mod and score_mod.__name__}, {mask_mod}")


def test_block_masks_from_torch_inputs_hold_torch_tensors(torch_flex):
    """torch's helpers (paged attention) call block_mask.kv_num_blocks.clone(): a mask made
    with a torch device, a mod reading torch tensors, or torch lists holds torch tensors."""
    torch, tf = torch_flex
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([30, 50, 20]))
    same_doc = lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx]  # noqa: E731
    causal = lambda b, h, q_idx, kv_idx: q_idx >= kv_idx  # noqa: E731
    plain = sdpa.create_block_mask(causal, 2, None, 100, 100, BLOCK_SIZE=16)
    assert isinstance(plain.kv_num_blocks, np.ndarray)
    theirs = tf.create_block_mask(same_doc, 2, 1, 100, 100, device="cpu", BLOCK_SIZE=16)
    for ours in (sdpa.create_block_mask(causal, 2, None, 100, 100, device="cpu", BLOCK_SIZE=16),
                 sdpa.create_block_mask(same_doc, 2, None, 100, 100, BLOCK_SIZE=16),
                 sdpa.flex.BlockMask.from_kv_blocks(theirs.kv_num_blocks, theirs.kv_indices,
                                                    theirs.full_kv_num_blocks,
                                                    theirs.full_kv_indices, BLOCK_SIZE=16,
                                                    mask_mod=same_doc)):
        for name in ("kv_num_blocks", "kv_indices", "full_q_indices"):
            field = getattr(ours, name)
            assert isinstance(field, torch.Tensor) and field.dtype == torch.int32, name
            assert field.shape[:2] == (2, 1) and field.clone().shape == field.shape
        assert isinstance(ours.to_dense(), torch.Tensor)
    doc_mask = sdpa.create_block_mask(same_doc, 2, None, 100, 100, BLOCK_SIZE=16)
    torch.testing.assert_close(doc_mask.to_dense() > 0, theirs.to_dense() > 0)
    np.testing.assert_array_equal(
        sdpa.create_block_mask(causal, 2, None, 100, 100, device="cpu", BLOCK_SIZE=16)
        .kv_num_blocks.numpy(), plain.kv_num_blocks)


def test_no_nanobind_leak_report_when_a_flex_output_outlives_the_interpreter(torch_flex):
    """A module-level output of flex_attention with autograd keeps its graph (and the
    sdpa._C.Program the backward needs) alive until the interpreter exits: sdpa drops those
    references first, so nanobind reports no leaked instances."""
    import subprocess
    import sys

    script = (
        "import torch, sdpa\n"
        "q = torch.randn(1, 2, 8, 4, requires_grad=True)\n"
        "out = sdpa.flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s * 0.5)\n"
        "kept = sdpa.flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s + i - j)\n"
        "out.sum().backward()\n"
        "print('ran', tuple(q.grad.shape))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ran (1, 2, 8, 4)" in done.stdout
    assert "leaked" not in done.stderr, done.stderr
