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


@pytest.mark.parametrize("shapes", [
    ((7, 16), (9, 16), (9, 12)),                                  # 2-D
    ((2, 3, 4, 7, 16), (2, 3, 4, 9, 16), (2, 3, 4, 9, 12)),       # 5-D
    ((3, 4, 7, 16), (1, 4, 9, 16), (1, 4, 9, 12)),                # k/v batch 1
    ((3, 4, 7, 16), (4, 9, 16), (4, 9, 12)),                      # 4-D q, 3-D k/v
    ((3, 4, 7, 16), (3, 1, 9, 16), (3, 1, 9, 12)),                # one k/v head
], ids=["2d", "5d", "kv_batch_1", "kv_3d", "kv_one_head"])
def test_ranks_and_broadcast_key_values_like_torch(shapes):
    sq, sk, sv = shapes
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
               for s in (sq, sk, sv))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected)
    grad_out = torch.randn_like(expected)
    for mine, theirs in zip(torch.autograd.grad(out, (q, k, v), grad_out),
                            torch.autograd.grad(expected, (q, k, v), grad_out)):
        assert mine.shape == theirs.shape
        torch.testing.assert_close(mine, theirs)
