"""Parity with torch.nn.functional.scaled_dot_product_attention on CPU: every option and
dtype, values and gradients (through the sdpa::attention custom op and autograd).

Tolerances follow PyTorch's own scheme (test/test_transformers.py, get_tolerances): the
reference is float64; the tolerance is fudge x max(dtype default, the error of PyTorch's
own same-dtype CPU implementation against that float64 reference).
"""

import zlib

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402
from sdpa.attention import bias as B  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DEFAULT_ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5,
                torch.float64: 1e-7}
DEFAULT_RTOL = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6,
                torch.float64: 1e-7}
# Fudge factors: outputs 2, gradients 4 (PyTorch uses 1-8 per tensor and backend).
FUDGE_OUT, FUDGE_GRAD = 2.0, 4.0


def get_tolerances(golden, lp_ref, fudge):
    """PyTorch's get_tolerances: atol/rtol of lp_ref against golden, floored by the
    dtype defaults and scaled by `fudge`."""
    dtype = lp_ref.dtype
    deviation = (golden - lp_ref.to(golden.dtype)).abs()
    atol = deviation.max().item() if deviation.numel() else 0.0
    rel = torch.nan_to_num(deviation / golden.abs(), nan=DEFAULT_RTOL[dtype],
                           posinf=DEFAULT_RTOL[dtype])
    rtol = rel.max().item() if rel.numel() else 0.0
    atol = fudge * max(atol, DEFAULT_ATOL[dtype])
    rtol = fudge * max(rtol, DEFAULT_RTOL[dtype])
    if rtol > 1e30:
        rtol = DEFAULT_RTOL[dtype]
    return atol, rtol


def assert_matches(actual, golden, lp_ref, fudge, name):
    atol, rtol = get_tolerances(golden, lp_ref, fudge)
    assert actual.dtype == lp_ref.dtype and actual.shape == lp_ref.shape, name
    torch.testing.assert_close(actual, golden.to(actual.dtype), atol=atol, rtol=rtol,
                               msg=lambda m: f"{name}: {m}")


# name -> (B, Hq, Hkv, L, S, E, Ev, options); B None = 3-D inputs. "mask" names a maker.
CASES = {
    "basic": (2, 3, 3, 5, 7, 8, 8, {}),
    "head_dim_vo_differs": (1, 2, 2, 6, 9, 16, 5, {}),
    "causal_square": (2, 2, 2, 6, 6, 8, 8, {"is_causal": True}),
    "causal_more_queries": (1, 2, 2, 9, 4, 8, 8, {"is_causal": True}),
    "causal_more_keys": (1, 2, 2, 3, 10, 8, 8, {"is_causal": True}),
    "scale": (1, 2, 2, 5, 5, 8, 8, {"scale": 0.37}),
    "gqa": (2, 6, 2, 5, 7, 8, 8, {"enable_gqa": True}),
    "gqa_causal": (1, 4, 1, 7, 7, 8, 8, {"enable_gqa": True, "is_causal": True}),
    "bool_mask_2d": (2, 2, 2, 5, 7, 8, 8, {"mask": "bool_LS"}),
    "bool_mask_4d": (2, 2, 2, 5, 7, 8, 8, {"mask": "bool_BHLS"}),
    "bool_mask_head_broadcast": (2, 3, 3, 5, 7, 8, 8, {"mask": "bool_B1LS"}),
    "float_mask_4d": (2, 2, 2, 5, 7, 8, 8, {"mask": "float_BHLS"}),
    "float_mask_broadcast": (2, 3, 3, 5, 7, 8, 8, {"mask": "float_1H1S"}),
    "float_mask_2d_gqa": (1, 4, 2, 6, 6, 8, 8, {"mask": "float_LS", "enable_gqa": True}),
    "unbatched": (None, 3, 3, 5, 7, 8, 8, {}),
    "unbatched_causal": (None, 2, 2, 6, 6, 8, 8, {"is_causal": True}),
    "unbatched_float_mask": (None, 2, 2, 5, 7, 8, 8, {"mask": "float_LS"}),
    "decode": (3, 2, 2, 1, 33, 16, 16, {}),
    "head_dim_1": (1, 1, 1, 4, 4, 1, 1, {}),
    "long_odd": (1, 2, 2, 70, 67, 24, 24, {"is_causal": True}),
    "head_dim_128": (1, 2, 2, 33, 40, 128, 128, {"mask": "bool_LS"}),
}


def make_mask(kind, B_, H, L, S, dtype, gen):
    if kind.startswith("bool"):
        shape = {"bool_LS": (L, S), "bool_BHLS": (B_, H, L, S), "bool_B1LS": (B_, 1, L, S)}[kind]
        m = torch.rand(shape, generator=gen) < 0.6
        m[..., 0] = True  # every query keeps a key
        return m
    shape = {"float_BHLS": (B_, H, L, S), "float_1H1S": (1, H, 1, S), "float_LS": (L, S)}[kind]
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()


def make_case(case, dtype):
    B_, Hq, Hkv, L, S, E, Ev, options = CASES[case]
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    lead = () if B_ is None else (B_,)

    def randn(*shape):
        x = torch.randn(lead + shape, generator=gen, dtype=torch.float64)
        return x.to(dtype).requires_grad_()

    q, k, v = randn(Hq, L, E), randn(Hkv, S, E), randn(Hkv, S, Ev)
    options = dict(options)
    if "mask" in options:
        options["attn_mask"] = make_mask(options.pop("mask"), B_ or 1, Hq, L, S, dtype, gen)
    return q, k, v, options


def as_golden(x):
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        return x
    return x.detach().to(torch.float64).requires_grad_(x.requires_grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_gradients_match_torch(case, dtype):
    q, k, v, options = make_case(case, dtype)
    mask = options.get("attn_mask")
    inputs = [q, k, v] + ([mask] if mask is not None and mask.requires_grad else [])
    names = ["query", "key", "value", "attn_mask"]

    out = sdpa.scaled_dot_product_attention(q, k, v, **options)
    lp_ref = F.scaled_dot_product_attention(q, k, v, **options)
    golden_inputs = [as_golden(x) for x in inputs]
    golden_options = {key: as_golden(val) for key, val in options.items()}
    if mask is not None and mask.requires_grad:
        golden_options["attn_mask"] = golden_inputs[3]
    golden = F.scaled_dot_product_attention(*golden_inputs[:3], **golden_options)

    assert isinstance(out, torch.Tensor) and out.requires_grad
    assert_matches(out.detach(), golden.detach(), lp_ref.detach(), FUDGE_OUT, "out")

    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                           dtype=torch.float64)
    grads = torch.autograd.grad(out, inputs, grad_out.to(dtype))
    lp_grads = torch.autograd.grad(lp_ref, inputs, grad_out.to(dtype))
    golden_grads = torch.autograd.grad(golden, golden_inputs, grad_out)
    for name, g, lp, gold in zip(names, grads, lp_grads, golden_grads):
        assert_matches(g, gold, lp, FUDGE_GRAD, f"grad of {name}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_noncontiguous_inputs(dtype):
    gen = torch.Generator().manual_seed(3)
    # [B, L, H, E] storage seen as [B, H, L, E], as attention layers produce it.
    q = torch.randn(2, 9, 4, 16, generator=gen).to(dtype).transpose(1, 2).requires_grad_()
    k = torch.randn(2, 11, 4, 16, generator=gen).to(dtype).transpose(1, 2).requires_grad_()
    v = torch.randn(2, 11, 4, 16, generator=gen).to(dtype).transpose(1, 2).requires_grad_()
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
    lp = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    golden = F.scaled_dot_product_attention(*(as_golden(x) for x in (q, k, v)), is_causal=True)
    assert_matches(out.detach(), golden.detach(), lp.detach(), FUDGE_OUT, "out")
    g = torch.ones_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(lp, (q, k, v), g)):
        torch.testing.assert_close(a, b, atol=5e-2 if dtype in (torch.bfloat16, torch.float16)
                                   else 1e-5, rtol=2e-2)


@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("L, S", [(4, 9), (9, 4), (6, 6)])
@pytest.mark.filterwarnings("ignore:Lower right causal bias")
def test_causal_bias_matches_torch_causal_bias(variant, L, S):
    import torch.nn.attention.bias as tb

    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 3, L, 8, generator=gen, requires_grad=True)
    k = torch.randn(2, 3, S, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, 3, S, 8, generator=gen, requires_grad=True)
    theirs = getattr(tb, f"causal_{variant}")(L, S)
    ours = getattr(B, f"causal_{variant}")(L, S)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=theirs)
    if variant == "lower_right" and L > S:
        # Rows with no key: PyTorch returns NaN there; sdpa returns zeros (documented).
        want = torch.nan_to_num(want)
    for mask in (ours, theirs):  # torch's CausalBias is accepted too
        got = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if not (variant == "lower_right" and L > S):
        g = torch.randn(want.shape, generator=gen)
        for a, b in zip(torch.autograd.grad(got, (q, k, v), g),
                        torch.autograd.grad(want, (q, k, v), g)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_give_zeros():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.all(out[:, :, 1] == 0)
    assert torch.isfinite(out).all()
