"""Second derivatives through sdpa's torch entry points (issue 28 item 4): gradgradcheck
in float64 (finite differences of the backward) on the eager path and the sdpa::attention
op, for masks, biases, GQA, causal, unbatched inputs and fully masked rows; first
derivatives stay the kernels'; dropout refuses a second derivative with sdpa.Error."""

import pytest

torch = pytest.importorskip("torch")

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402
from sdpa.attention.bias import causal_lower_right  # noqa: E402


def _inputs(B=1, Hq=2, Hkv=2, L=5, S=7, E=3, Ev=4, seed=0, batched=True):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, Hq, L, E), (B, Hkv, S, E), (B, Hkv, S, Ev)]
    if not batched:
        shapes = [s[1:] for s in shapes]
    return [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
            for s in shapes]


def _through_op(q, k, v, **kw):
    mask, spec = sdpa.torch._mask_args(kw.get("attn_mask"), q, k)
    return torch.ops.sdpa.attention(q, k, v, mask, spec, 0.0, kw.get("is_causal", False),
                                    kw.get("scale"), kw.get("enable_gqa", False), 0, -1)[0]


def _bool_mask(L, S, dead_row=None):
    keep = torch.rand(L, S, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[:, 0] = True
    if dead_row is not None:
        keep[dead_row] = False  # a fully masked row: out 0 and no gradient
    return keep


CASES = {
    "plain": ({}, {}),
    "causal scaled": ({"is_causal": True, "scale": 0.7}, {"L": 7, "S": 7}),
    "gqa": ({"enable_gqa": True}, {"Hq": 4, "Hkv": 2}),
    "bool mask with a dead row": ({"attn_mask": _bool_mask(5, 7, dead_row=2)}, {}),
    "bias": ({"attn_mask": causal_lower_right(5, 7)}, {}),
    "unbatched": ({"is_causal": True}, {"batched": False, "L": 4, "S": 4}),
}


@pytest.mark.parametrize("route", ["eager", "op"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradgradcheck(case, route):
    kw, shape = CASES[case]
    inputs = _inputs(**shape)
    call = sdpa.torch.scaled_dot_product_attention if route == "eager" else _through_op
    assert torch.autograd.gradgradcheck(lambda q, k, v: call(q, k, v, **kw), inputs)


def test_float_mask_gets_second_derivatives():
    q, k, v = _inputs()
    mask = torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(4),
                       requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda q, k, v, m: sdpa.torch.scaled_dot_product_attention(q, k, v, attn_mask=m),
        (q, k, v, mask))


def test_first_derivatives_stay_the_kernels_and_match_the_formula():
    q, k, v = (t.detach().float().requires_grad_() for t in _inputs(L=65, S=70, E=16, Ev=8))
    out = sdpa.torch.scaled_dot_product_attention_with_lse(q, k, v, is_causal=True)
    assert out.backend == sdpa.SDPBackend.FLASH_ATTENTION
    g = torch.randn(out.out.shape, generator=torch.Generator().manual_seed(1))
    plain = torch.autograd.grad(out.out, (q, k, v), g, retain_graph=True)
    graph = torch.autograd.grad(out.out, (q, k, v), g, create_graph=True)
    assert all(not t.requires_grad for t in plain) and all(t.requires_grad for t in graph)
    for a, b in zip(plain, graph):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_dropout_refuses_a_second_derivative():
    q, k, v = _inputs()
    out = sdpa.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    with pytest.raises(sdpa.Error, match="dropout_p > 0 has no differentiable backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
