"""Calls at the edges of the domain that torch's SDPA accepts: dropout_p = 1 and head_dim
0. sdpa must give what torch gives (values, shapes and gradients), not an error."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402


def _inputs(shape_q, shape_kv, e_v=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    e_v = shape_kv[-1] if e_v is None else e_v
    q = torch.randn(*shape_q, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(*shape_kv, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(*shape_kv[:-1], e_v, generator=g, dtype=torch.float64, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("is_causal", [False, True])
def test_dropout_one_gives_zeros_and_zero_gradients_like_torch(is_causal):
    q, k, v = _inputs((2, 3, 9, 16), (2, 3, 11, 16))
    expected = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0, is_causal=is_causal)
    out = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=1.0, is_causal=is_causal)
    assert torch.equal(out, expected) and not out.any()
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and not t.grad.any()


@pytest.mark.parametrize("e_v", [0, 5])
def test_head_dim_zero_like_torch(e_v):
    q, k, v = _inputs((2, 2, 4, 0), (2, 2, 6, 0), e_v=e_v)
    # torch's default scale 1/sqrt(0) is inf (0 * inf = NaN scores); with a finite scale
    # every score is 0 and the weights are uniform, which sdpa gives for any scale.
    expected = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    out = sdpa.scaled_dot_product_attention(q, k, v)
    assert out.shape == expected.shape == (2, 2, 4, e_v)
    torch.testing.assert_close(out, expected)
    grad_out = torch.randn_like(expected)
    grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    ours = torch.autograd.grad(out, (q, k, v), grad_out)
    for mine, theirs in zip(ours, grads):
        assert mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs)
