"""allow_fp16_bf16_reduction_math_sdp: MATH computing float16 / bfloat16 in their own dtype,
against torch's math path with the same switch (the oracle), and off by default."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend as TorchBackend  # noqa: E402
from torch.nn.attention import sdpa_kernel as torch_kernel  # noqa: E402

import sdpa  # noqa: E402


@pytest.fixture
def restore_switches():
    yield
    sdpa.backends.allow_fp16_bf16_reduction_math_sdp(False)
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)


def _inputs(dtype, B=2, Hq=4, Hkv=4, L=7, S=65, E=33, Ev=33, seed=0, transposed=False):
    g = torch.Generator().manual_seed(seed)
    if transposed:  # [B, L, H, E] memory viewed as [B, H, L, E]
        q = torch.randn(B, L, Hq, E, generator=g).to(dtype).transpose(1, 2)
        k = torch.randn(B, S, Hkv, E, generator=g).to(dtype).transpose(1, 2)
        v = torch.randn(B, S, Hkv, Ev, generator=g).to(dtype).transpose(1, 2)
        return q, k, v
    return (torch.randn(B, Hq, L, E, generator=g).to(dtype),
            torch.randn(B, Hkv, S, E, generator=g).to(dtype),
            torch.randn(B, Hkv, S, Ev, generator=g).to(dtype))


def _torch_math(q, k, v, reduced, **kw):
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(reduced)
    try:
        with torch_kernel(TorchBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)


def _sdpa_math(q, k, v, reduced, **kw):
    sdpa.backends.allow_fp16_bf16_reduction_math_sdp(reduced)
    try:
        with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
            return sdpa.scaled_dot_product_attention(q, k, v, **kw)
    finally:
        sdpa.backends.allow_fp16_bf16_reduction_math_sdp(False)


def _diff(a, b):
    return (a.double() - b.double()).abs()


def _bool_mask_with_empty_row(L, S, seed=3):
    m = torch.rand(L, S, generator=torch.Generator().manual_seed(seed)) > 0.4
    m[L // 2] = False
    return m


CASES = {
    "plain": ({}, {}),
    "tiny": ({"B": 1, "Hq": 1, "Hkv": 1, "L": 1, "S": 1, "E": 8, "Ev": 8}, {}),
    "gqa_ev": ({"Hq": 4, "Hkv": 2, "Ev": 17}, {"enable_gqa": True}),
    "causal_l_ne_s": ({"L": 65, "S": 7}, {"is_causal": True}),
    "bool_mask_empty_row": ({"L": 9, "S": 63}, {"attn_mask": _bool_mask_with_empty_row(9, 63)}),
    "negative_scale": ({}, {"scale": -0.3}),
    "transposed": ({"transposed": True, "L": 63}, {}),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_reduced_math_matches_torch(dtype, case, restore_switches):
    shape, kw = CASES[case]
    q, k, v = _inputs(dtype, **shape)
    want = _torch_math(q, k, v, True, **kw)
    upcast = _torch_math(q, k, v, False, **kw)
    got = _sdpa_math(q, k, v, True, **kw)
    assert got.dtype == dtype and got.shape == want.shape
    err, gap = _diff(got, want), _diff(upcast, want)
    # Equal to torch's own rounding up to the products' summation order: far closer to it
    # than the float32-upcast result is.
    assert err.max() <= max(gap.max().item(), 0.0)
    assert err.mean() <= 0.1 * gap.mean() or err.max() == 0
    # The switch is per call state, not sticky; the default stays the upcast.
    assert not sdpa.backends.fp16_bf16_reduction_math_sdp_allowed()
    default = _sdpa_math(q, k, v, False, **kw)
    assert _diff(default, upcast).mean() <= 0.1 * gap.mean() or _diff(default, upcast).max() == 0


def test_reduced_math_changes_the_result(restore_switches):
    # At these sizes the two computations differ (else the test above would prove nothing).
    q, k, v = _inputs(torch.bfloat16, L=33, S=257)
    assert _diff(_sdpa_math(q, k, v, True), _sdpa_math(q, k, v, False)).max() > 0


def test_torch_callers_follow_torchs_switch(restore_switches):
    q, k, v = _inputs(torch.float16, L=20, S=70)
    want = _torch_math(q, k, v, True)
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
        got = sdpa.scaled_dot_product_attention(q, k, v)
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
    assert not sdpa.backends.fp16_bf16_reduction_math_sdp_allowed()
    assert torch.equal(got, want) or _diff(got, want).max() <= _diff(
        _torch_math(q, k, v, False), want).max()


def test_numpy_float16_and_other_backends(restore_switches):
    q, k, v = (x.numpy() for x in _inputs(torch.float16, L=10, S=40))
    want = _torch_math(*(torch.from_numpy(x) for x in (q, k, v)), True).numpy()
    got = _sdpa_math(q, k, v, True)
    assert isinstance(got, np.ndarray) and got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=0,
                               atol=2 ** -10)
    # FLASH is not affected (torch's switch is for its math path only).
    sdpa.backends.allow_fp16_bf16_reduction_math_sdp(True)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
        flash_on = sdpa.scaled_dot_product_attention(q, k, v)
    sdpa.backends.allow_fp16_bf16_reduction_math_sdp(False)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
        flash_off = sdpa.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(flash_on, flash_off)
