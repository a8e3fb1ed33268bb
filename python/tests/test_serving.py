"""sdpa.attention_with_kvcache and sdpa.merge_attention_states on numpy arrays, against
the float64 reference of attention_reference.py over each sequence's exact keys: ragged
lengths, GQA, in-place appends, causal bottom-right, windows, the error path leaving the
caches untouched, and the merge against attention over all keys at once."""

import numpy as np
import pytest

import sdpa
from attention_reference import causal_keep, forward, tolerance


def _bhsd(x):
    return np.ascontiguousarray(x.transpose(1, 0, 2))  # [L, H, E] -> [H, L, E]


@pytest.mark.parametrize("causal", [False, True])
def test_ragged_append_matches_reference(rng, causal):
    B, S_max, Hq, Hkv, E, Ev, L = 3, 80, 4, 2, 20, 12, 3
    lengths = [0, 17, 77]
    q = rng.standard_normal((B, L, Hq, E)).astype(np.float32)
    k_cache = rng.standard_normal((B, S_max, Hkv, E)).astype(np.float32)
    v_cache = rng.standard_normal((B, S_max, Hkv, Ev)).astype(np.float32)
    k_new = rng.standard_normal((B, L, Hkv, E)).astype(np.float32)
    v_new = rng.standard_normal((B, L, Hkv, Ev)).astype(np.float32)
    k_before = k_cache.copy()
    out, lse = sdpa.attention_with_kvcache(
        q, k_cache, v_cache, np.array(lengths, np.int32), k_new, v_new, causal=causal,
        return_lse=True)
    assert out.shape == (B, L, Hq, Ev) and lse.shape == (B, Hq, L)
    for b, n in enumerate(lengths):
        np.testing.assert_array_equal(k_cache[b, n:n + L], k_new[b])  # appended in place
        np.testing.assert_array_equal(k_cache[b, :n], k_before[b, :n])
        keys, values = k_cache[b, :n + L], v_cache[b, :n + L]
        mask = causal_keep(L, n + L, lower_right=True) if causal else None
        want, want_lse, _ = forward(_bhsd(q[b])[None], _bhsd(keys)[None], _bhsd(values)[None],
                                    mask=mask, enable_gqa=True)
        np.testing.assert_allclose(out[b].transpose(1, 0, 2), want[0], **tolerance(np.float32))
        np.testing.assert_allclose(lse[b], want_lse[0], atol=1e-4)


def test_decode_window_and_int_seqlens(rng):
    B, S_max, H, E = 2, 300, 2, 16
    q = rng.standard_normal((B, 1, H, E)).astype(np.float32)
    k_cache = rng.standard_normal((B, S_max, H, E)).astype(np.float32)
    v_cache = rng.standard_normal((B, S_max, H, E)).astype(np.float32)
    out = sdpa.attention_with_kvcache(q, k_cache, v_cache, 257, window_size=(31, 0))
    for b in range(B):
        keys, values = k_cache[b, 257 - 32:257], v_cache[b, 257 - 32:257]
        want, _, _ = forward(_bhsd(q[b])[None], _bhsd(keys)[None], _bhsd(values)[None])
        np.testing.assert_allclose(out[b].transpose(1, 0, 2), want[0], **tolerance(np.float32))


def test_bad_input_writes_nothing(rng):
    q = rng.standard_normal((2, 1, 2, 8)).astype(np.float32)
    k_cache = rng.standard_normal((2, 16, 2, 8)).astype(np.float32)
    v_cache = rng.standard_normal((2, 16, 2, 8)).astype(np.float32)
    k_new = rng.standard_normal((2, 3, 2, 8)).astype(np.float32)
    before = (k_cache.copy(), v_cache.copy())
    with pytest.raises(sdpa.Error, match="exceeds the cache's capacity of 16"):
        sdpa.attention_with_kvcache(q, k_cache, v_cache, np.array([1, 14], np.int32),
                                    k_new, k_new)
    with pytest.raises(sdpa.Error, match="expected an int32 tensor"):
        sdpa.attention_with_kvcache(q, k_cache, v_cache, np.array([1, 2], np.int64),
                                    k_new, k_new)
    np.testing.assert_array_equal(k_cache, before[0])
    np.testing.assert_array_equal(v_cache, before[1])


def test_merge_matches_attention_over_all_keys(rng):
    q = rng.standard_normal((2, 3, 5, 16)).astype(np.float32)
    k = rng.standard_normal((2, 3, 70, 16)).astype(np.float32)
    v = rng.standard_normal((2, 3, 70, 9)).astype(np.float32)
    a = sdpa.scaled_dot_product_attention_with_lse(q, k[:, :, :41], v[:, :, :41])
    b = sdpa.scaled_dot_product_attention_with_lse(q, k[:, :, 41:], v[:, :, 41:])
    out, lse = sdpa.merge_attention_states(a.out, a.lse, b.out, b.lse)
    want, want_lse, _ = forward(q, k, v)
    np.testing.assert_allclose(out, want, **tolerance(np.float32))
    np.testing.assert_allclose(lse, want_lse, atol=1e-5)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_cache_matches_contiguous(rng, page_size):
    B, S_max, Hq, Hkv, E, L = 3, 128, 4, 2, 16, 2
    lengths = np.array([0, 37, 120], np.int32)
    q = rng.standard_normal((B, L, Hq, E)).astype(np.float32)
    k_cache = rng.standard_normal((B, S_max, Hkv, E)).astype(np.float32)
    v_cache = rng.standard_normal((B, S_max, Hkv, E)).astype(np.float32)
    k_new = rng.standard_normal((B, L, Hkv, E)).astype(np.float32)
    v_new = rng.standard_normal((B, L, Hkv, E)).astype(np.float32)
    pages = S_max // page_size
    ids = rng.permutation(B * pages + 2).astype(np.int32)  # shuffled, two spare pages
    table = ids[:B * pages].reshape(B, pages)
    k_pool = np.zeros((B * pages + 2, page_size, Hkv, E), np.float32)
    v_pool = np.zeros_like(k_pool)
    k_pool[table] = k_cache.reshape(B, pages, page_size, Hkv, E)
    v_pool[table] = v_cache.reshape(B, pages, page_size, Hkv, E)
    want, want_lse = sdpa.attention_with_kvcache(q, k_cache, v_cache, lengths, k_new, v_new,
                                                 causal=True, return_lse=True)
    got, lse = sdpa.attention_with_kvcache(q, k_pool, v_pool, lengths, k_new, v_new,
                                           causal=True, return_lse=True, block_table=table)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-6, atol=2e-6)
    np.testing.assert_array_equal(k_pool[table].reshape(B, S_max, Hkv, E), k_cache)  # appended
    np.testing.assert_array_equal(v_pool[table].reshape(B, S_max, Hkv, E), v_cache)


def test_paged_cache_bad_table_writes_nothing(rng):
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    k_pool = rng.standard_normal((2, 4, 2, 8)).astype(np.float32)
    before = k_pool.copy()
    with pytest.raises(sdpa.Error, match=r"block_table\[0\]\[1\] = 7"):
        sdpa.attention_with_kvcache(q, k_pool, k_pool.copy(), np.array([5], np.int32),
                                    q[:, :, :, :], q.copy(), block_table=np.array([[0, 7]], np.int32))
    np.testing.assert_array_equal(k_pool, before)


def test_append_paged_kv_cache_writes_in_place(rng):
    pages, page_size, H, E = 6, 4, 2, 8
    k_pool = rng.standard_normal((pages, page_size, H, E)).astype(np.float32)
    v_pool = rng.standard_normal((pages, page_size, H, E)).astype(np.float32)
    table = np.array([[5, 0, 3], [1, 4, 2]], np.int32)
    k_new = rng.standard_normal((2, 5, H, E)).astype(np.float32)
    v_new = rng.standard_normal((2, 5, H, E)).astype(np.float32)
    k_want = k_pool[table].reshape(2, 12, H, E).copy()
    k_want[0, 2:7], k_want[1, 6:11] = k_new[0], k_new[1]
    sdpa.append_paged_kv_cache(k_new, v_new, k_pool, v_pool, table, np.array([2, 6], np.int32))
    np.testing.assert_array_equal(k_pool[table].reshape(2, 12, H, E), k_want)
    with pytest.raises(sdpa.Error, match=r"positions\[0\] = 8 with 5 new keys exceeds"):
        sdpa.append_paged_kv_cache(k_new, v_new, k_pool, v_pool, table, 8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float8_paged_cache_matches_dequantized_reference(rng, dtype):
    """float8_e4m3fn pools with per-head scales (torch tensors): appends stored as torch's
    own rounding of x / scale, attention equal to the float64 reference over the
    dequantized cache."""
    torch = pytest.importorskip("torch")
    B, S_max, Hq, Hkv, E, L, page_size = 3, 64, 8, 2, 24, 2, 16
    lengths = np.array([0, 21, 60], np.int32)
    k_scale, v_scale = torch.tensor([0.25, 3.0]), torch.tensor([1.5, 0.125])
    pages = S_max // page_size
    table = rng.permutation(B * pages + 1).astype(np.int32)[:B * pages].reshape(B, pages)
    cache = lambda d: torch.from_numpy(  # noqa: E731
        rng.standard_normal((B * pages + 1, page_size, Hkv, d)) * 8).to(torch.float8_e4m3fn)
    k_pool, v_pool = cache(E), cache(E)
    q = torch.from_numpy(rng.standard_normal((B, L, Hq, E))).to(getattr(torch, dtype))
    k_new = torch.from_numpy(rng.standard_normal((B, L, Hkv, E))).to(q.dtype)
    v_new = torch.from_numpy(rng.standard_normal((B, L, Hkv, E))).to(q.dtype)
    out, lse = sdpa.attention_with_kvcache(
        q, k_pool, v_pool, lengths, k_new, v_new, causal=True, return_lse=True,
        block_table=table, k_scale=k_scale, v_scale=v_scale)
    scale = lambda s: s[None, None, :, None].double()  # noqa: E731
    rows = lambda pool: pool.view(torch.uint8)[torch.from_numpy(table).long()].reshape(  # noqa: E731
        B, S_max, Hkv, E).view(torch.float8_e4m3fn)
    k_seq, v_seq = rows(k_pool), rows(v_pool)
    for b, n in enumerate(lengths):
        quantized_k = (k_new[b].float() / k_scale[:, None]).to(torch.float8_e4m3fn)
        quantized_v = (v_new[b].float() / v_scale[:, None]).to(torch.float8_e4m3fn)
        assert torch.equal(k_seq[b, n:n + L].view(torch.uint8), quantized_k.view(torch.uint8))
        assert torch.equal(v_seq[b, n:n + L].view(torch.uint8), quantized_v.view(torch.uint8))
        keys = (k_seq[b:b + 1, :n + L].double() * scale(k_scale))[0].numpy()
        values = (v_seq[b:b + 1, :n + L].double() * scale(v_scale))[0].numpy()
        want, want_lse, _ = forward(_bhsd(q[b].double().numpy())[None], _bhsd(keys)[None],
                                    _bhsd(values)[None],
                                    mask=causal_keep(L, n + L, lower_right=True),
                                    enable_gqa=True)
        got = out[b].transpose(0, 1).double().numpy()
        rtol = 1e-5 if dtype == "float32" else 1 / 128
        np.testing.assert_allclose(got, want[0], rtol=rtol, atol=rtol * np.abs(want).max())
        np.testing.assert_allclose(lse[b].numpy(), want_lse[0], rtol=1e-5, atol=1e-4)


def test_float8_cache_scale_errors_write_nothing(rng):
    torch = pytest.importorskip("torch")
    k = torch.from_numpy(rng.standard_normal((1, 8, 2, 8))).to(torch.float8_e4m3fn)
    before = k.view(torch.uint8).clone()
    q = torch.randn(1, 1, 2, 8)
    new = torch.randn(1, 1, 2, 8)
    with pytest.raises(sdpa.Error, match=r"k_scale\[0\] = 0: expected a finite scale > 0"):
        sdpa.attention_with_kvcache(q, k, k.clone(), 3, new, new, k_scale=torch.tensor([0.0, 1.0]))
    with pytest.raises(sdpa.Error, match="v_scale: only float8_e4m3fn caches take scales"):
        sdpa.attention_with_kvcache(q, k.float(), k.float(), 3, v_scale=2.0)
    assert torch.equal(k.view(torch.uint8), before)
    out = sdpa.attention_with_kvcache(q, k, k.clone(), 3, k_scale=0.5, v_scale=2)  # numbers
    assert out.shape == (1, 1, 2, 8)
