"""sdpa.attention.bias (numpy only): every native bias gives what its materialize() gives,
forward and backward; Python subclasses that only implement materialize() work."""

import json

import numpy as np
import pytest

import sdpa
import attention_reference as ref
from sdpa.attention import bias as B

B_, H, L, S = 2, 4, 6, 9


def biases():
    """(name, bias, (batch, heads, L, S)) for every kind and variant."""
    return [
        ("causal_upper_left", B.causal_upper_left(L, S), (B_, H, L, S)),
        ("causal_lower_right", B.causal_lower_right(L, S), (B_, H, L, S)),
        ("causal_lower_right_more_queries", B.causal_lower_right(S, L), (B_, H, S, L)),
        ("causal_bias_class", B.CausalBias(B.CausalVariant.LOWER_RIGHT, L, S), (B_, H, L, S)),
        ("local_causal_window", B.LocalAttentionBias(2, 0), (B_, H, L, S)),
        ("local_top_left", B.LocalAttentionBias(3, 1, "top_left"), (B_, H, L, S)),
        ("local_right_only", B.LocalAttentionBias(None, 2), (B_, H, L, S)),
        ("alibi_heads", B.AlibiBias(H), (B_, H, L, S)),
        ("alibi_slopes", B.AlibiBias([0.5, 0.1, 0.25, 1.0], alignment="top_left"), (B_, H, L, S)),
        ("block_diagonal", B.BlockDiagonalBias.from_seqlens([2, 4], [4, 5]), (1, H, L, S)),
        ("block_diagonal_causal",
         B.BlockDiagonalBias([0, 3, 6], [0, 4, 9], causal=True), (1, H, L, S)),
        ("block_diagonal_causal_bottom_right",
         B.BlockDiagonalBias([0, 3, 6], [0, 4, 9], causal=True, alignment="bottom_right"),
         (1, H, L, S)),
        ("padded_keys", B.PaddedKeysBias([5, 9]), (B_, H, L, S)),
        ("padded_keys_causal", B.PaddedKeysBias([7, 9], causal=True), (B_, H, L, S)),
        ("compose_causal_alibi", B.compose(B.causal_lower_right(L, S), B.AlibiBias(H)),
         (B_, H, L, S)),
        ("compose_documents_causal_alibi",
         B.compose([B.BlockDiagonalBias.from_seqlens([3, 3], [4, 5], causal=True),
                    B.AlibiBias(H)]), (1, H, L, S)),
        ("compose_padding_window", B.compose(B.PaddedKeysBias([6, 9]), B.LocalAttentionBias(4, 0)),
         (B_, H, L, S)),
        ("compose_with_dense_array",
         B.compose(B.causal_lower_right(L, S), np.tril(np.ones((L, S), bool), 5)),
         (B_, H, L, S)),
    ]


def inputs(rng, shape, dtype=np.float64):
    b, h, n_q, s = shape
    return (rng.standard_normal((b, h, n_q, 8)).astype(dtype),
            rng.standard_normal((b, h, s, 8)).astype(dtype),
            rng.standard_normal((b, h, s, 8)).astype(dtype))


@pytest.mark.parametrize("name, bias, shape", biases(), ids=[b[0] for b in biases()])
def test_native_bias_matches_its_materialization(rng, name, bias, shape):
    q, k, v = inputs(rng, shape)
    dense = bias.materialize(shape, "float64")
    assert isinstance(dense, np.ndarray) and dense.dtype in (np.bool_, np.float64)
    np.broadcast_shapes(dense.shape, shape)
    native = sdpa.scaled_dot_product_attention_with_lse(q, k, v, attn_mask=bias)
    want_out, want_lse, _ = ref.forward(q, k, v, dense)
    np.testing.assert_allclose(native.out, want_out, atol=1e-10, rtol=1e-9)
    np.testing.assert_allclose(native.lse, want_lse, atol=1e-5, rtol=1e-5)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):  # materialized by the dense path
        math = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    np.testing.assert_allclose(math, want_out, atol=1e-10, rtol=1e-9)

    g = rng.standard_normal(native.out.shape)
    grads = sdpa.scaled_dot_product_attention_backward(g, q, k, v, native.out, native.lse,
                                                       attn_mask=bias)
    want = ref.backward(g, q, k, v, dense)
    for got, expected in zip(grads[:3], want[:3]):
        np.testing.assert_allclose(got, expected, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("name, bias, shape", biases(), ids=[b[0] for b in biases()])
def test_spec_rebuilds_the_same_bias(name, bias, shape):
    if name == "compose_with_dense_array":
        assert bias._spec is None  # a tensor part cannot be described: it materializes
        return
    spec = json.loads(bias._spec)
    assert spec["type"]
    rebuilt = B.from_spec(bias._spec)
    assert rebuilt.describe() == bias.describe()
    np.testing.assert_array_equal(np.from_dlpack(rebuilt.materialize(shape, "float32")),
                                  bias.materialize(shape, "float32"))


def test_materialize_values():
    m = B.causal_lower_right(2, 4).materialize((2, 4))
    np.testing.assert_array_equal(m.reshape(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    m = B.causal_upper_left(2, 4).materialize((1, 1, 2, 4), np.float32)
    np.testing.assert_array_equal(m.reshape(2, 4), [[1, 0, 0, 0], [1, 1, 0, 0]])
    a = B.AlibiBias(slopes=[0.5], alignment="top_left").materialize((1, 1, 2, 3), "float32")
    assert a.dtype == np.float32
    np.testing.assert_allclose(a.reshape(2, 3), [[0, -0.5, -1], [-0.5, 0, -0.5]])
    assert B.alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert B.AlibiBias(8).slopes == B.alibi_slopes(8)
    assert B.CausalVariant.UPPER_LEFT.value == 1 and B.CausalVariant.LOWER_RIGHT.value == 2
    c = B.causal_lower_right(3, 5)
    assert (c.variant, c.seq_len_q, c.seq_len_kv) == (B.CausalVariant.LOWER_RIGHT, 3, 5)
    assert "causal lower-right" in repr(c)


def test_invalid_biases_raise():
    with pytest.raises(ValueError):
        B.LocalAttentionBias(-1, 0)
    with pytest.raises(ValueError):
        B.causal_upper_left(3)
    with pytest.raises(ValueError):
        B.BlockDiagonalBias([1, 2])
    with pytest.raises(ValueError):
        B.AlibiBias()
    with pytest.raises(ValueError):
        B.PaddedKeysBias([-1])
    with pytest.raises(ValueError):
        B.compose()
    q = np.zeros((2, 2, 3, 4))
    with pytest.raises(ValueError):  # 3 batch lengths for a batch of 2
        sdpa.scaled_dot_product_attention(q, q, q, attn_mask=B.PaddedKeysBias([1, 2, 3]))


class Banded(B.AttnBias):
    """A user bias: keys within `width` of the diagonal (bool)."""

    def __init__(self, width):
        self.width = width
        self.calls = []

    def materialize(self, shape, dtype):
        self.calls.append((tuple(shape), dtype))
        i = np.arange(shape[2])[:, None]
        j = np.arange(shape[3])[None, :]
        return np.abs(i - j) <= self.width

    def describe(self):
        return f"banded(width={self.width})"


class Additive(B.AttnBias):
    def materialize(self, shape, dtype):
        return np.full(shape, -0.5, dtype=dtype) * np.arange(shape[3], dtype=dtype)


def test_python_subclass_with_materialize_only(rng):
    q, k, v = inputs(rng, (2, 3, 5, 7))
    bias = Banded(1)
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert bias.calls == [((2, 3, 5, 7), "float64")]
    dense = bias.materialize((2, 3, 5, 7), "float64")
    np.testing.assert_allclose(out, ref.forward(q, k, v, dense)[0], atol=1e-10, rtol=1e-9)
    fwd = sdpa.scaled_dot_product_attention_with_lse(q, k, v, attn_mask=bias)
    g = rng.standard_normal(out.shape)
    grads = sdpa.scaled_dot_product_attention_backward(g, q, k, v, fwd.out, fwd.lse,
                                                       attn_mask=bias)
    np.testing.assert_allclose(grads.grad_q, ref.backward(g, q, k, v, dense)[0], atol=1e-10)
    assert "banded(width=1)" in str(sdpa.explain(q, k, v, attn_mask=bias))
    # Additive float masks of the requested dtype, and composition with native biases.
    add = Additive()
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=add)
    np.testing.assert_allclose(
        out, ref.forward(q, k, v, add.materialize((2, 3, 5, 7), "float64"))[0], atol=1e-10)
    both = B.compose(bias, B.causal_lower_right(5, 7))
    assert both._spec is None
    want = ref.forward(q, k, v, dense & ref.causal_keep(5, 7, lower_right=True))[0]
    np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, k, v, attn_mask=both),
                               want, atol=1e-10)
    # Duck typing: any object with materialize() is accepted too.

    class Duck:
        def materialize(self, shape, dtype):
            return np.ones(shape[2:], dtype=bool)

    np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, k, v, attn_mask=Duck()),
                               ref.forward(q, k, v)[0], atol=1e-10)


def test_python_subclass_errors_propagate(rng):
    q, k, v = inputs(rng, (1, 1, 3, 3))

    class Broken(B.AttnBias):
        def materialize(self, shape, dtype):
            raise KeyError("no mask today")

    with pytest.raises(KeyError, match="no mask today"):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=Broken())

    class WrongDtype(B.AttnBias):
        def materialize(self, shape, dtype):
            return np.zeros(shape, dtype=np.int32)

    with pytest.raises(ValueError, match="attn_mask"):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=WrongDtype())

    class NotAnArray(B.AttnBias):
        def materialize(self, shape, dtype):
            return "mask"

    with pytest.raises(TypeError, match="materialize"):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=NotAnArray())

    with pytest.raises(NotImplementedError):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=B.AttnBias())
