"""jax arrays in, jax arrays out (zero-copy in through DLPack), bfloat16 included."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import sdpa  # noqa: E402
import attention_reference as ref  # noqa: E402


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)])
def test_jax_arrays(rng, dtype, tol):
    q = jnp.asarray(rng.standard_normal((2, 4, 6, 8)), dtype=dtype)
    k = jnp.asarray(rng.standard_normal((2, 2, 9, 8)), dtype=dtype)
    v = jnp.asarray(rng.standard_normal((2, 2, 9, 8)), dtype=dtype)
    r = sdpa.scaled_dot_product_attention_with_lse(q, k, v, is_causal=True, enable_gqa=True)
    assert isinstance(r.out, jax.Array) and r.out.dtype == dtype and r.out.shape == (2, 4, 6, 8)
    assert isinstance(r.lse, jax.Array) and r.lse.dtype == jnp.float32
    want = ref.forward(*(np.asarray(x.astype(jnp.float32)) for x in (q, k, v)),
                       is_causal=True, enable_gqa=True)[0]
    np.testing.assert_allclose(np.asarray(r.out.astype(jnp.float32)), want, atol=tol, rtol=tol)
    assert sdpa.Tensor.from_dlpack(q).data_ptr == q.unsafe_buffer_pointer()


def test_jax_flex_attention_with_jax_tables_in_closures(rng):
    L, E = 40, 8
    q, k, v = (jnp.asarray(rng.standard_normal((1, 2, L, E)), dtype=jnp.float32)
               for _ in range(3))
    slopes = jnp.asarray([0.5, 0.25], dtype=jnp.float32)
    doc = jnp.asarray(np.repeat(np.arange(3), [15, 5, 20]))

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)  # jax arrays indexed by traced values

    def same_doc(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    bm = sdpa.create_block_mask(same_doc, None, None, L, L, BLOCK_SIZE=8)
    out = sdpa.flex_attention(q, k, v, score_mod=alibi, block_mask=bm)
    assert isinstance(out, jax.Array) and out.shape == (1, 2, L, E)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    d = np.asarray(doc)
    bias = np.asarray(slopes)[:, None, None] * (j - i)
    s = np.einsum("bhle,bhse->bhls", *(np.asarray(x, np.float64) for x in (q, k))) / np.sqrt(E)
    s = np.where((d[i] == d[j]) & (i >= j), s + bias, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ np.asarray(v, np.float64)
    np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-5)
