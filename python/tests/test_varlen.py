"""sdpa.attention_varlen (flash-attn's flash_attn_varlen_func) against the float64
reference of attention_reference.py run on each packed sequence alone: ragged lengths with
empty sequences, GQA, bottom-right causal, windows; torch autograd against torch's own
SDPA per sequence in float64; bad packing as sdpa.Error."""

import numpy as np
import pytest

import sdpa
from attention_reference import backward, causal_keep, forward, tolerance

Q_LENS = [1, 7, 0, 65, 3, 40]
K_LENS = [5, 7, 0, 65, 0, 90]


def _cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _heads_first(x):
    return np.ascontiguousarray(x.transpose(1, 0, 2))[None]  # [n, H, E] -> [1, H, n, E]


def _window_keep(L, S, left, right):
    i = np.arange(L)[:, None] + S - L
    j = np.arange(S)[None, :]
    keep = np.ones((L, S), bool)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)),
                                           (False, (6, 2))])
def test_packed_sequences_match_reference(rng, causal, window):
    Hq, Hkv, E, Ev = 4, 2, 20, 12
    q = rng.standard_normal((sum(Q_LENS), Hq, E)).astype(np.float32)
    k = rng.standard_normal((sum(K_LENS), Hkv, E)).astype(np.float32)
    v = rng.standard_normal((sum(K_LENS), Hkv, Ev)).astype(np.float32)
    out, lse = sdpa.attention_varlen(q, k, v, _cu(Q_LENS), _cu(K_LENS), max(Q_LENS),
                                     max(K_LENS), causal=causal, window_size=window,
                                     return_lse=True)
    assert out.shape == (sum(Q_LENS), Hq, Ev) and lse.shape == (Hq, sum(Q_LENS))
    cq, ck = _cu(Q_LENS), _cu(K_LENS)
    for b, (L, S) in enumerate(zip(Q_LENS, K_LENS)):
        rows = slice(cq[b], cq[b + 1])
        if L == 0:
            continue
        if S == 0:  # queries without keys: out 0, lse -inf
            assert not out[rows].any() and np.all(np.isneginf(lse[:, rows]))
            continue
        keys, values = slice(ck[b], ck[b + 1]), slice(ck[b], ck[b + 1])
        keep = causal_keep(L, S, lower_right=True) if causal else _window_keep(L, S, *window)
        want, want_lse, _ = forward(_heads_first(q[rows]), _heads_first(k[keys]),
                                    _heads_first(v[values]), mask=keep, enable_gqa=True)
        got = out[rows].transpose(1, 0, 2)
        seen = keep.any(axis=1)  # rows that see a key (others: 0)
        np.testing.assert_allclose(got[:, seen], want[0][:, seen], **tolerance(np.float32))
        np.testing.assert_allclose(lse[:, rows][:, seen], want_lse[0][:, seen], atol=1e-4)
        assert not got[:, ~seen].any()


def test_paged_keys_equal_packed_keys(rng):
    """block_table: the keys of each sequence in shuffled pages of a pool (flash-attn's
    paged varlen, chunked prefill) give the packed call's results, through the
    flash_attn_varlen_func shim too; torch tensors that require grad are refused."""
    from sdpa.compat import flash_attn as fa

    Hq, Hkv, E, Ev, page = 4, 2, 20, 12, 16
    lens_k = [5, 7, 0, 65, 0, 90]
    q = rng.standard_normal((sum(Q_LENS), Hq, E)).astype(np.float32)
    k = rng.standard_normal((sum(lens_k), Hkv, E)).astype(np.float32)
    v = rng.standard_normal((sum(lens_k), Hkv, Ev)).astype(np.float32)
    width = -(-max(lens_k) // page)
    pages = rng.permutation(len(lens_k) * width + 3).astype(np.int32)
    table = pages[:len(lens_k) * width].reshape(len(lens_k), width)
    k_pool = rng.standard_normal((len(pages), page, Hkv, E)).astype(np.float32)
    v_pool = rng.standard_normal((len(pages), page, Hkv, Ev)).astype(np.float32)
    ck = _cu(lens_k)
    for b, n in enumerate(lens_k):
        for j in range(n):
            k_pool[table[b, j // page], j % page] = k[ck[b] + j]
            v_pool[table[b, j // page], j % page] = v[ck[b] + j]
    args = (_cu(Q_LENS), ck, max(Q_LENS), max(lens_k))
    want, want_lse = sdpa.attention_varlen(q, k, v, *args, causal=True, return_lse=True)
    got, lse = sdpa.attention_varlen(q, k_pool, v_pool, *args, causal=True, return_lse=True,
                                     block_table=table)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=1e-6)
    shim = fa.flash_attn_varlen_func(q, k_pool, v_pool, *args, causal=True, block_table=table)
    np.testing.assert_array_equal(shim, got)
    torch = pytest.importorskip("torch")
    tq = torch.from_numpy(q).requires_grad_()
    with pytest.raises(sdpa.Error, match="no backward"):
        sdpa.attention_varlen(tq, torch.from_numpy(k_pool), torch.from_numpy(v_pool),
                              *(torch.from_numpy(a) for a in args[:2]), *args[2:],
                              block_table=torch.from_numpy(table))
    with torch.no_grad():
        out = sdpa.attention_varlen(tq, torch.from_numpy(k_pool), torch.from_numpy(v_pool),
                                    *(torch.from_numpy(a) for a in args[:2]), *args[2:],
                                    causal=True, block_table=torch.from_numpy(table))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)


def test_numpy_backward_matches_reference(rng):
    Hq, E = 2, 16
    lens = [9, 33, 1]
    q = rng.standard_normal((sum(lens), Hq, E)).astype(np.float32)
    k = rng.standard_normal((sum(lens), Hq, E)).astype(np.float32)
    v = rng.standard_normal((sum(lens), Hq, E)).astype(np.float32)
    grad = rng.standard_normal((sum(lens), Hq, E)).astype(np.float32)
    cu = _cu(lens)
    out, lse = sdpa.attention_varlen(q, k, v, cu, cu, 33, 33, causal=True, return_lse=True)
    gq, gk, gv = sdpa._C.attention_varlen_backward(grad, q, k, v, out, lse, cu, cu, 33, 33,
                                                   True, -1, -1, [], 0.0, None)
    gq, gk, gv = (np.asarray(g) for g in (gq, gk, gv))
    for b in range(len(lens)):
        r = slice(cu[b], cu[b + 1])
        want = backward(_heads_first(grad[r]), _heads_first(q[r]), _heads_first(k[r]),
                        _heads_first(v[r]), is_causal=True)
        for got, w in zip((gq, gk, gv), want[:3]):
            np.testing.assert_allclose(got[r].transpose(1, 0, 2), w[0], atol=2e-4, rtol=1e-3)


def test_torch_autograd_matches_torch_per_sequence():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    Hq, Hkv, E = 4, 2, 24
    lens_q, lens_k = [3, 50, 17], [10, 50, 60]
    q = torch.randn(sum(lens_q), Hq, E, generator=g, requires_grad=True)
    k = torch.randn(sum(lens_k), Hkv, E, generator=g, requires_grad=True)
    v = torch.randn(sum(lens_k), Hkv, E, generator=g, requires_grad=True)
    weight = torch.randn(sum(lens_q), Hq, E, generator=g)
    cq, ck = torch.tensor(_cu(lens_q)), torch.tensor(_cu(lens_k))
    out = sdpa.attention_varlen(q, k, v, cq, ck, 50, 60, causal=True, softcap=3.0)
    assert isinstance(out, torch.Tensor)
    (out * weight).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    outs = []
    for b in range(3):
        qs = q64[cq[b]:cq[b + 1]].transpose(0, 1)
        ks = k64[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        vs = v64[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        scores = qs @ ks.transpose(-1, -2) / E ** 0.5
        scores = 3.0 * torch.tanh(scores / 3.0)
        L, S = qs.shape[1], ks.shape[1]
        keep = torch.ones(L, S, dtype=torch.bool).tril(S - L)
        outs.append((scores.masked_fill(~keep, float("-inf")).softmax(-1) @ vs).transpose(0, 1))
    want = torch.cat(outs)
    (want * weight).sum().backward()
    assert (out.double() - want).abs().max().item() < 2e-5
    for got, ref in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (got.double() - ref).abs().max().item() < 1e-4


def test_bad_packing_is_an_error(rng):
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    k = rng.standard_normal((12, 2, 8)).astype(np.float32)
    with pytest.raises(sdpa.Error, match="cu_seqlens_q: expected an int32"):
        sdpa.attention_varlen(q, k, k, _cu([4, 6]).astype(np.int64), _cu([5, 7]), 6, 7)
    with pytest.raises(sdpa.Error, match="above max_seqlen_k = 6"):
        sdpa.attention_varlen(q, k, k, _cu([4, 6]), _cu([5, 7]), 6, 6)
    with pytest.raises(sdpa.Error, match=r"cu_seqlens_k\[B\]: expected the packed length 12"):
        sdpa.attention_varlen(q, k, k, _cu([4, 6]), _cu([5, 6]), 6, 7)
