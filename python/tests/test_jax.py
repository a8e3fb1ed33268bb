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


# --- jax transformations: jit / grad / vmap through the XLA FFI custom call (sdpa._jax) ---

needs_ffi = pytest.mark.skipif(not hasattr(sdpa._C, "jax_ffi_targets"),
                               reason="sdpa built without jax's XLA FFI headers")

# (atol, rtol) of sdpa's result against the float64 reference, per dtype.
JAX_TOL = {jnp.float32: (3e-5, 1e-4), jnp.bfloat16: (3e-2, 3e-2), jnp.float16: (4e-3, 1e-2),
           jnp.float64: (1e-10, 1e-9)}

# (Hq, Hkv, L, S, E, Ev, enable_gqa, mask kind, is_causal); "bool_rows" fully masks rows.
CASES = [
    (1, 1, 1, 1, 5, 5, False, None, False),
    (2, 2, 7, 63, 33, 5, False, "float", False),
    (4, 2, 65, 257, 5, 33, True, None, False),
    (4, 2, 7, 63, 33, 33, True, "bool_rows", False),
    (2, 2, 65, 7, 5, 3, False, None, True),
    (2, 2, 7, 63, 5, 8, False, "float_row", False),
]


def make_inputs(rng, case, dtype, batch=2):
    hq, hkv, L, S, E, Ev, gqa, mask_kind, causal = case
    q, k, v = (jnp.asarray(rng.standard_normal(shape), dtype=dtype)
               for shape in ((batch, hq, L, E), (batch, hkv, S, E), (batch, hkv, S, Ev)))
    mask = None
    if mask_kind == "bool_rows":
        keep = rng.random((batch, 1, L, S)) < 0.7
        keep[:, :, ::3] = False  # every third query row sees no key: out 0, lse -inf
        mask = jnp.asarray(keep)
    elif mask_kind == "float":
        mask = jnp.asarray(rng.standard_normal((L, S)), dtype=dtype)
    elif mask_kind == "float_row":  # broadcast over heads and keys' rows
        mask = jnp.asarray(rng.standard_normal((batch, 1, 1, S)), dtype=dtype)
    return q, k, v, mask, dict(is_causal=causal, enable_gqa=gqa)


def as64(x):
    """numpy float64 (bool masks stay bool), for the reference."""
    return None if x is None else np.asarray(x, dtype=bool if x.dtype == bool else np.float64)


def assert_close(got, want, dtype, scale=1.0):
    atol, rtol = JAX_TOL[dtype]
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32 if dtype != jnp.float64
                                                      else jnp.float64)),
                               want, atol=atol * scale, rtol=rtol * scale)


@needs_ffi
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_jit_forward_equals_eager_and_reference(rng, case, dtype):
    q, k, v, mask, opts = make_inputs(rng, case, dtype)
    f = jax.jit(lambda q, k, v, m: sdpa.scaled_dot_product_attention_with_lse(q, k, v, m,
                                                                              **opts)[:2])
    out, lse = f(q, k, v, mask)
    eager = sdpa.scaled_dot_product_attention_with_lse(q, k, v, mask, **opts)
    assert out.dtype == dtype and out.shape == eager.out.shape and lse.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)),
                                  np.asarray(eager.out.astype(jnp.float32)))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(eager.lse))
    want, want_lse, _ = ref.forward(as64(q), as64(k), as64(v), as64(mask), **opts)
    assert_close(out, want, dtype)
    np.testing.assert_allclose(np.asarray(lse), want_lse, atol=1e-2, rtol=1e-2)
    if case[7] == "bool_rows":
        assert np.all(np.asarray(out.astype(jnp.float32))[:, :, ::3] == 0)
        assert np.all(np.isneginf(np.asarray(lse)[:, :, ::3]))


def loss_fn(opts, weights):
    def loss(q, k, v, mask):
        out = sdpa.scaled_dot_product_attention(q, k, v, mask, **opts)
        return jnp.sum(out.astype(weights.dtype) * weights)
    return loss


@needs_ffi
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_grad_equals_reference(rng, case, dtype):
    with jax.enable_x64(dtype == jnp.float64):
        q, k, v, mask, opts = make_inputs(rng, case, dtype)
        w = jnp.asarray(rng.standard_normal(q.shape[:-1] + (v.shape[-1],)),
                        jnp.float64 if dtype == jnp.float64 else jnp.float32)
        float_mask = mask is not None and mask.dtype != bool
        argnums = (0, 1, 2, 3) if float_mask else (0, 1, 2)
        grads = jax.grad(loss_fn(opts, w), argnums=argnums)(q, k, v, mask)
        want = ref.backward(np.asarray(w, np.float64), as64(q), as64(k), as64(v), as64(mask),
                            **opts)
        for got, expected in zip(grads, want):
            assert got.dtype == dtype and got.shape == expected.shape
            assert_close(got, expected, dtype, scale=10.0)


@needs_ffi
def test_grad_equals_jax_dot_product_attention(rng):
    q, k, v, _, _ = make_inputs(rng, (4, 2, 7, 63, 8, 8, True, None, False), jnp.float32)
    w = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)

    def theirs(q, k, v):  # jax.nn takes [B, T, N, H]
        t = lambda x: x.swapaxes(1, 2)
        return jnp.sum(t(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True)) * w)

    ours = lambda q, k, v: loss_fn(dict(is_causal=True, enable_gqa=True), w)(q, k, v, None)
    for got, want in zip(jax.grad(ours, (0, 1, 2))(q, k, v), jax.grad(theirs, (0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-4)


@needs_ffi
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3], CASES[5]])
@pytest.mark.parametrize("in_axes", [(0, 0, 0, 0), (0, None, None, None), (None, 0, 0, None)])
def test_vmap_equals_loop(rng, case, in_axes):
    q, k, v, mask, opts = make_inputs(rng, case, jnp.float32, batch=3)
    args = (q, k, v, mask)
    if mask is not None and mask.ndim == 2:
        in_axes = in_axes[:3] + (None,)
    # An unbatched argument is the first batch element, [H, T, D].
    args = tuple(a if (ax == 0 or a is None) else a[0] for a, ax in zip(args, in_axes))
    f = lambda q, k, v, m: sdpa.scaled_dot_product_attention(q, k, v, m, **opts)
    got = jax.jit(jax.vmap(f, in_axes=in_axes))(*args)
    for i in range(3):
        one = [a if (a is None or ax is None) else a[i] for a, ax in zip(args, in_axes)]
        np.testing.assert_allclose(np.asarray(got[i]), np.asarray(f(*one)), atol=1e-6, rtol=1e-6)


@needs_ffi
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[5]])
def test_jit_and_vmap_of_grad_compose(rng, case):
    q, k, v, mask, opts = make_inputs(rng, case, jnp.float32, batch=3)
    w = jnp.asarray(rng.standard_normal(q.shape[1:-1] + (v.shape[-1],)), jnp.float32)
    float_mask = mask is not None and mask.dtype != bool
    argnums = (0, 1, 2, 3) if float_mask else (0, 1, 2)
    grad = jax.grad(loss_fn(opts, w), argnums=argnums)
    m_axis = None if mask is None or mask.ndim == 2 else 0
    # k and v shared by the batch: their per-example gradients differ.
    batched = jax.jit(jax.vmap(grad, in_axes=(0, None, None, m_axis)))(q, k[0], v[0], mask)
    for i in range(3):
        mi = mask if m_axis is None else mask[i]
        for got, want in zip(batched, jax.jit(grad)(q[i], k[0], v[0], mi)):
            np.testing.assert_allclose(np.asarray(got[i]), np.asarray(want),
                                       atol=1e-6, rtol=1e-5)
        want = ref.backward(np.asarray(w, np.float64), as64(q[i]), as64(k[0]), as64(v[0]),
                            as64(mi), **opts)
        for got, expected in zip(batched, want):
            assert_close(got[i], expected, jnp.float32, scale=10.0)


@needs_ffi
def test_vmap_of_3d_inputs_and_nested_vmap(rng):
    q = jnp.asarray(rng.standard_normal((2, 3, 4, 7, 5)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((3, 4, 9, 5)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((3, 4, 9, 6)), jnp.float32)
    f = sdpa.scaled_dot_product_attention
    got = jax.vmap(jax.vmap(f), in_axes=(0, None, None))(q, k, v)  # f sees 3-D [H, L, E]
    want = ref.forward(as64(q), as64(k)[None], as64(v)[None])[0]
    assert got.shape == (2, 3, 4, 7, 6)
    np.testing.assert_allclose(np.asarray(got), want, atol=3e-5, rtol=1e-4)


@needs_ffi
def test_backend_guard_is_captured_at_trace_time(rng):
    q, k, v = (jnp.asarray(rng.standard_normal((1, 2, 64, 32)), jnp.float32) for _ in range(3))

    def traced():  # a new function each time: jax reuses a function's trace
        return jax.jit(lambda q, k, v: sdpa.scaled_dot_product_attention_with_lse(q, k, v)[:2])

    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
        math_jit = traced().lower(q, k, v).compile()
        math_eager = sdpa.scaled_dot_product_attention_with_lse(q, k, v)
    flash_eager = sdpa.scaled_dot_product_attention_with_lse(q, k, v)
    assert math_eager.backend == sdpa.SDPBackend.MATH
    assert flash_eager.backend == sdpa.SDPBackend.FLASH_ATTENTION
    # MATH and FLASH round differently here, so equality shows which one ran.
    assert not np.array_equal(np.asarray(math_eager.out), np.asarray(flash_eager.out))
    for got, want in zip(math_jit(q, k, v), math_eager[:2]):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Only a backend that cannot run a CPU call: the traced call fails when it runs ...
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        cudnn_only = traced().lower(q, k, v).compile()
    with pytest.raises(Exception, match="CUDNN_ATTENTION"):
        cudnn_only(q, k, v)
    # ... and a function traced without a guard ignores a guard active when it runs.
    default = traced().lower(q, k, v).compile()
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        out, lse = default(q, k, v)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(flash_eager.out))


@needs_ffi
def test_errors_under_jit_name_the_argument(rng):
    q = jnp.asarray(rng.standard_normal((2, 2, 7, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 2, 9, 5)), jnp.float32)  # E != query's
    v = jnp.asarray(rng.standard_normal((2, 2, 9, 8)), jnp.float32)
    with pytest.raises(Exception, match="key"):
        jax.jit(sdpa.scaled_dot_product_attention)(q, k, v).block_until_ready()
    with pytest.raises(sdpa.Error, match="dropout_p"):
        jax.jit(lambda q: sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.1))(q)
    with pytest.raises(NotImplementedError, match="stop_gradient"):
        jax.grad(lambda q: sdpa.scaled_dot_product_attention_with_lse(q, q, q).lse.sum())(q)
    # With stop_gradient the lse is a constant and out's gradient flows.
    grad = jax.grad(lambda q: jnp.sum(sdpa.scaled_dot_product_attention(q, q, q) ** 2)
                    + jax.lax.stop_gradient(sdpa.scaled_dot_product_attention_with_lse(
                        q, q, q).lse).sum())(q)
    assert grad.shape == q.shape and bool(jnp.all(jnp.isfinite(grad)))


def test_traced_call_without_ffi_handlers_says_how_to_rebuild(monkeypatch):
    from sdpa import _jax

    monkeypatch.delattr(sdpa._C, "jax_ffi_targets", raising=False)
    with pytest.raises(sdpa.Error, match="SDPA_XLA_FFI_INCLUDE_DIR"):
        _jax._register_targets.__wrapped__()
