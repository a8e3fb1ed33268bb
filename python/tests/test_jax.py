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
