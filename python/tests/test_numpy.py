"""numpy-only tests (no torch): values and gradients against the float64 reference, the
DLPack boundary, errors, backends, explain, dropout and info."""

import os
import subprocess
import sys

import numpy as np
import pytest

import sdpa
import attention_reference as ref

# name -> (B, Hq, Hkv, L, S, E, Ev, options); B None = unbatched 3-D inputs. A mask in
# options is a string built by make_mask().
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
    "unbatched": (None, 3, 3, 5, 7, 8, 8, {}),
    "unbatched_mask_causal_gqa": (None, 4, 2, 6, 6, 8, 8, {"enable_gqa": True, "mask": "bool_LS"}),
    "decode": (3, 2, 2, 1, 33, 16, 16, {}),
    "head_dim_1": (1, 1, 1, 4, 4, 1, 1, {}),
    "long_odd": (1, 2, 2, 70, 67, 24, 24, {"is_causal": True}),
    "fully_masked_row": (1, 2, 2, 4, 5, 8, 8, {"mask": "bool_row0_masked"}),
}


def make_inputs(rng, case, dtype):
    B, Hq, Hkv, L, S, E, Ev, options = CASES[case]
    lead = () if B is None else (B,)
    q = rng.standard_normal(lead + (Hq, L, E)).astype(dtype)
    k = rng.standard_normal(lead + (Hkv, S, E)).astype(dtype)
    v = rng.standard_normal(lead + (Hkv, S, Ev)).astype(dtype)
    options = dict(options)
    if "mask" in options:
        options["attn_mask"] = make_mask(rng, options.pop("mask"), B or 1, Hq, L, S, dtype,
                                         unbatched=B is None)
    return q, k, v, options


def make_mask(rng, kind, B, H, L, S, dtype, unbatched=False):
    """Random masks in which every row keeps at least one key (except bool_row0_masked)."""
    if kind.startswith("bool"):
        shape = {"bool_LS": (L, S), "bool_BHLS": (B, H, L, S), "bool_B1LS": (B, 1, L, S),
                 "bool_row0_masked": (B, H, L, S)}[kind]
        m = rng.random(shape) < 0.6
        m[..., 0] = True
        if kind == "bool_row0_masked":
            m[..., 0, :] = False
        return m[0] if unbatched and m.ndim == 4 else m
    shape = {"float_BHLS": (B, H, L, S), "float_1H1S": (1, H, 1, S)}[kind]
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_reference(rng, case, dtype):
    q, k, v, options = make_inputs(rng, case, dtype)
    result = sdpa.scaled_dot_product_attention_with_lse(q, k, v, **options)
    want_out, want_lse, _ = ref.forward(q, k, v, options.get("attn_mask"),
                                        options.get("is_causal", False), options.get("scale"),
                                        options.get("enable_gqa", False))
    assert isinstance(result.out, np.ndarray) and result.out.dtype == dtype
    assert result.out.shape == want_out.shape
    np.testing.assert_allclose(result.out.astype(np.float64), want_out, **ref.tolerance(dtype))
    assert result.lse.dtype == np.float32 and result.lse.shape == want_lse.shape
    np.testing.assert_allclose(result.lse, want_lse, atol=1e-4, rtol=1e-4)
    plain = sdpa.scaled_dot_product_attention(q, k, v, **options)
    np.testing.assert_array_equal(plain, result.out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", [c for c in CASES if c != "fully_masked_row"])
def test_backward_matches_reference(rng, case, dtype):
    q, k, v, options = make_inputs(rng, case, dtype)
    mask = options.get("attn_mask")
    float_mask = mask is not None and mask.dtype != bool
    fwd = sdpa.scaled_dot_product_attention_with_lse(q, k, v, **options)
    grad_out = rng.standard_normal(fwd.out.shape).astype(dtype)
    grads = sdpa.scaled_dot_product_attention_backward(
        grad_out, q, k, v, fwd.out, fwd.lse, **options, attn_mask_requires_grad=float_mask)
    want = ref.backward(grad_out, q, k, v, mask, options.get("is_causal", False),
                        options.get("scale"), options.get("enable_gqa", False))
    tol = ref.tolerance(dtype)
    for got, expected, like in zip(grads[:3], want[:3], (q, k, v)):
        assert got.shape == like.shape and got.dtype == dtype
        np.testing.assert_allclose(got, expected, **tol)
    if float_mask:
        assert grads.grad_attn_mask.shape == mask.shape
        np.testing.assert_allclose(grads.grad_attn_mask, want[3], **tol)
    else:
        assert grads.grad_attn_mask is None
    assert isinstance(grads.backend, sdpa.SDPBackend)


def test_noncontiguous_views_are_read_in_place(rng):
    # [B, L, H, E] storage seen as [B, H, L, E]: strided views, no copies needed.
    q = rng.standard_normal((2, 5, 3, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    k = rng.standard_normal((2, 7, 3, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    v = rng.standard_normal((2, 7, 3, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    out = sdpa.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, ref.forward(q, k, v)[0], **ref.tolerance(np.float32))
    t = sdpa.Tensor.from_dlpack(q)
    assert t.data_ptr == q.ctypes.data
    assert t.strides == tuple(s // q.itemsize for s in q.strides)


def test_zero_copy_import_and_export(rng):
    a = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    t = sdpa.Tensor.from_dlpack(a)
    assert t.data_ptr == a.ctypes.data and t.shape == a.shape and t.dtype == "float32"
    back = np.from_dlpack(t)
    assert back.ctypes.data == a.ctypes.data
    assert t.numpy().ctypes.data == a.ctypes.data
    assert np.asarray(t).ctypes.data == a.ctypes.data
    # Read-only inputs (broadcast views) come in through DLPack 1.0's read-only flag.
    mask = np.broadcast_to(np.ones((1, 4, 4), dtype=bool), (3, 4, 4))
    assert not mask.flags.writeable
    out = sdpa.scaled_dot_product_attention(a, a, a, attn_mask=mask)
    np.testing.assert_allclose(out, sdpa.scaled_dot_product_attention(a, a, a), rtol=1e-6)


def test_raw_capsules(rng):
    a = rng.standard_normal((1, 2, 3, 4)).astype(np.float64)
    legacy = a.__dlpack__()
    versioned = a.__dlpack__(max_version=(1, 0))
    out = sdpa.scaled_dot_product_attention(legacy, versioned, a)
    assert isinstance(out, sdpa.Tensor)  # no framework to return to: sdpa.Tensor
    np.testing.assert_allclose(np.from_dlpack(out), ref.forward(a, a, a)[0], rtol=1e-12)
    with pytest.raises(ValueError, match="imported only once"):
        sdpa.scaled_dot_product_attention(legacy, a, a)


def test_result_outlives_inputs(rng):
    q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    expected = ref.forward(q, q, q)[0]
    out = sdpa.scaled_dot_product_attention(q.copy(), q.copy(), q.copy())
    del q
    import gc

    gc.collect()
    np.testing.assert_allclose(out, expected, **ref.tolerance(np.float32))
    out[...] = 0  # the result is an ordinary, writable array
    assert not out.any()


def test_sdpa_tensor_exports_versioned_and_legacy(rng):
    t = sdpa.Tensor.from_dlpack(rng.standard_normal((2, 3)).astype(np.float32))
    legacy, versioned = t.__dlpack__(), t.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy) and "dltensor_versioned" in repr(versioned)
    assert t.__dlpack_device__() == (1, 0)
    del legacy, versioned  # unconsumed capsules free their tensors


@pytest.mark.parametrize("call, error, match", [
    (lambda q: sdpa.scaled_dot_product_attention(q[0, 0, 0], q, q), ValueError,
     r"query: expected 2 to 8 dimensions \[\*, L, E\], got 1-D"),
    (lambda q: sdpa.scaled_dot_product_attention(q[0, 0], q, q), ValueError,
     r"key: expected 2 to 2 dimensions \(at most the query's\), got 4-D"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q.astype(np.float64), q), ValueError,
     "key: expected dtype float32"),
    (lambda q: sdpa.scaled_dot_product_attention(q.astype(np.int32), q, q), ValueError,
     "query: expected dtype float32, float64, bfloat16 or float16"),
    (lambda q: sdpa.scaled_dot_product_attention([[1.0]], q, q), TypeError,
     "query: expected an array with __dlpack__"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, "v"), TypeError,
     "value: expected an array with __dlpack__"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((4, 4), bool),
                                                 is_causal=True), ValueError,
     "attn_mask: expected no mask when is_causal"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, dropout_p=1.5), ValueError,
     r"dropout_p: expected a probability in \[0, 1\], got 1.5"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.1, generator="x"),
     TypeError, "generator: expected an sdpa.Generator or None, got str"),
    (lambda q: sdpa.scaled_dot_product_attention_with_lse(q, q, q, dropout_p=0.1,
                                                          dropout_state=(-1, 2**70)),
     ValueError, r"dropout_state: expected seed and offset in \[0, 2\^64\), got \(-1, "),
    (lambda q: sdpa.scaled_dot_product_attention_with_lse(q, q, q, dropout_p=0.1,
                                                          dropout_state=(1.5, 2)),
     TypeError, r"dropout_state: expected a \(seed, offset\) pair of integers"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((4, 4), np.uint8)),
     ValueError, "attn_mask: from_dlpack: expected a float16/32/64, bfloat16, bool, int32, "
     "int64 or float8_e4m3fn tensor, got uint8"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, dropout_p="0.1"), TypeError,
     "dropout_p: expected a number, got str '0.1'"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, scale=[0.5]), TypeError,
     r"scale: expected a number, got list \[0.5\]"),
    (lambda q: sdpa.scaled_dot_product_attention(q, np.ones((2, 3, 4, 4), np.float32),
                                                 np.ones((2, 3, 4, 4), np.float32)),
     ValueError, "enable_gqa"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, scale=float("nan")), ValueError,
     "scale: expected a finite number"),
    (lambda q: sdpa.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((4, 4), np.float64)),
     ValueError, "attn_mask: expected dtype bool or float32"),
    (lambda q: sdpa.scaled_dot_product_attention(
        q, q, q, attn_mask=sdpa.attention.bias.causal_lower_right(3, 4)), ValueError,
     "CausalBias was made for L=3, S=4"),
    (lambda q: sdpa.scaled_dot_product_attention_backward(q, q, q, q, q, q[..., 0],
                                                          dropout_p=0.5),
     ValueError, "dropout_state"),
    (lambda q: sdpa.scaled_dot_product_attention_backward(q, q, q, q, q, q, ),
     ValueError, "lse: expected shape"),
])
def test_bad_input_raises_with_the_library_message(call, error, match):
    q = np.ones((2, 2, 4, 4), dtype=np.float32)
    with pytest.raises(error, match=match):
        call(q)


def test_error_type():
    # A ValueError, and a RuntimeError as torch raises for invalid SDPA input (code written
    # for torch catches that).
    assert issubclass(sdpa.Error, ValueError) and issubclass(sdpa.Error, RuntimeError)
    for caught in (sdpa.Error, ValueError, RuntimeError):
        with pytest.raises(caught, match="query: expected 2 to 8 dimensions"):
            sdpa.scaled_dot_product_attention(np.ones(2, np.float32), np.ones(2, np.float32),
                                              np.ones(2, np.float32))


def test_backend_enum_matches_pytorch_values():
    assert {b.name: b.value for b in sdpa.SDPBackend} == {
        "ERROR": -1, "MATH": 0, "FLASH_ATTENTION": 1, "EFFICIENT_ATTENTION": 2,
        "CUDNN_ATTENTION": 3, "OVERRIDEABLE": 4}
    assert sdpa.attention.SDPBackend is sdpa.SDPBackend


def test_sdpa_kernel_selects_and_restores(rng):
    q = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    default = sdpa.backends.active_backends()
    assert sdpa.scaled_dot_product_attention_with_lse(q, q, q).backend == \
        sdpa.SDPBackend.FLASH_ATTENTION
    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
        assert sdpa.backends.active_backends() == [sdpa.SDPBackend.MATH]
        assert not sdpa.backends.flash_sdp_enabled() and sdpa.backends.math_sdp_enabled()
        r = sdpa.scaled_dot_product_attention_with_lse(q, q, q)
        assert r.backend == sdpa.SDPBackend.MATH
        with sdpa.sdpa_kernel(["flash", "math"]):  # names work too; innermost wins
            assert sdpa.scaled_dot_product_attention_with_lse(q, q, q).backend == \
                sdpa.SDPBackend.FLASH_ATTENTION
        with sdpa.sdpa_kernel([sdpa.SDPBackend.MATH, sdpa.SDPBackend.FLASH_ATTENTION],
                              set_priority=True):
            assert sdpa.backends.active_backends()[0] == sdpa.SDPBackend.MATH
        assert sdpa.backends.active_backends() == [sdpa.SDPBackend.MATH]
    assert sdpa.backends.active_backends() == default
    with pytest.raises(ValueError, match="at least one backend"):
        with sdpa.sdpa_kernel([]):
            pass
    with pytest.raises(ValueError):
        with sdpa.sdpa_kernel("no_such_backend"):
            pass
    assert sdpa.backends.active_backends() == default

    @sdpa.sdpa_kernel(sdpa.SDPBackend.MATH)
    def decorated():
        return sdpa.backends.active_backends()

    assert decorated() == [sdpa.SDPBackend.MATH] and decorated() == [sdpa.SDPBackend.MATH]
    assert sdpa.attention.sdpa_kernel is sdpa.sdpa_kernel


def test_sdpa_kernel_restores_after_an_exception(rng):
    default = sdpa.backends.active_backends()
    with pytest.raises(RuntimeError):
        with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
            raise RuntimeError("boom")
    assert sdpa.backends.active_backends() == default


def test_no_allowed_backend_lists_reasons():
    q = np.ones((1, 1, 2, 4), np.float32)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):
        with pytest.raises(ValueError, match="CUDNN_ATTENTION"):
            sdpa.scaled_dot_product_attention(q, q, q)


def test_process_wide_flags(rng):
    q = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    assert sdpa.backends.flash_sdp_enabled()
    sdpa.backends.enable_flash_sdp(False)
    try:
        assert not sdpa.backends.flash_sdp_enabled()
        assert sdpa.scaled_dot_product_attention_with_lse(q, q, q).backend == sdpa.SDPBackend.MATH
        with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):  # a guard overrides flags
            assert sdpa.backends.flash_sdp_enabled()
    finally:
        sdpa.backends.enable_flash_sdp(True)
    assert sdpa.scaled_dot_product_attention_with_lse(q, q, q).backend == \
        sdpa.SDPBackend.FLASH_ATTENTION
    for name in ("math", "mem_efficient", "cudnn", "overrideable"):
        assert isinstance(getattr(sdpa.backends, f"{name}_sdp_enabled")(), bool)
        assert callable(getattr(sdpa.backends, f"enable_{name}_sdp"))


def test_amx_bf16_availability_follows_the_cpu_and_the_switch():
    available = sdpa.backends.cpu.amx_bf16_available()
    assert isinstance(available, bool)
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    # Linux lists amx_tile only where the CPU has it and the kernel manages its state.
    if not {"amx_tile", "amx_bf16"} <= flags or os.environ.get("SDPA_DISABLE_AMX") == "1":
        assert not available


def test_cpu_capability(rng):
    cap = sdpa.backends.cpu.get_cpu_capability()
    assert cap in ("AVX512", "AVX2", "DEFAULT")
    assert sdpa.backends.cpu.detected_cpu_capability() in ("AVX512", "AVX2", "DEFAULT")
    q = rng.standard_normal((1, 2, 19, 24)).astype(np.float32)
    expected = ref.forward(q, q, q, is_causal=True)[0]
    sdpa.backends.cpu.set_cpu_capability("DEFAULT")
    try:
        assert sdpa.backends.cpu.get_cpu_capability() == "DEFAULT"
        out = sdpa.scaled_dot_product_attention(q, q, q, is_causal=True)
    finally:
        sdpa.backends.cpu.set_cpu_capability("")
    assert sdpa.backends.cpu.get_cpu_capability() == cap
    np.testing.assert_allclose(out, expected, **ref.tolerance(np.float32))
    with pytest.raises(ValueError):
        sdpa.backends.cpu.set_cpu_capability("SSE9")


def test_explain(rng):
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    e = sdpa.explain(q, q, q, is_causal=True)
    assert isinstance(e, sdpa.Explanation)
    assert e.chosen == sdpa.SDPBackend.FLASH_ATTENTION
    text = str(e)
    assert text.startswith("chosen: FLASH_ATTENTION")
    assert "CUDNN_ATTENTION is not supported because:" in text
    verdicts = {v.backend: v for v in e.verdicts}
    assert verdicts[sdpa.SDPBackend.MATH].supported and verdicts[sdpa.SDPBackend.MATH].allowed
    assert not verdicts[sdpa.SDPBackend.CUDNN_ATTENTION].supported
    assert verdicts[sdpa.SDPBackend.CUDNN_ATTENTION].reasons
    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
        assert sdpa.explain(q, q, q).chosen == sdpa.SDPBackend.MATH
    e = sdpa.explain(q, q, q, attn_mask=sdpa.attention.bias.causal_lower_right(5, 5))
    assert verdicts and "native" in {v.backend: v for v in e.verdicts}[
        sdpa.SDPBackend.FLASH_ATTENTION].bias_handling
    assert sdpa.explain(q, q, q, backward=True).chosen != sdpa.SDPBackend.ERROR
    with sdpa.sdpa_kernel(sdpa.SDPBackend.CUDNN_ATTENTION):  # explaining never raises
        assert sdpa.explain(q, q, q).chosen == sdpa.SDPBackend.ERROR
    with pytest.raises(ValueError):
        sdpa.explain(q[0, 0], q, q)


def test_explain_does_not_consume_dropout_randomness(rng):
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    sdpa.manual_seed(7)
    a = sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    sdpa.manual_seed(7)
    sdpa.explain(q, q, q, dropout_p=0.5)
    b = sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    np.testing.assert_array_equal(a, b)


def dropout_multiplier(q, k, p, state, **options):
    """The [B, H, L, S] dropout multiplier (0 or 1/(1-p)) a call with `state` applies,
    read back by attending to V = identity: out = (P * D) @ I."""
    S = k.shape[-2]
    eye = np.broadcast_to(np.eye(S, dtype=q.dtype), k.shape[:-2] + (S, S))
    r = sdpa.scaled_dot_product_attention_with_lse(q, k, eye, dropout_p=p, dropout_state=state,
                                                   **options)
    P = ref.forward(q, k, eye, **options)[2]
    return np.where(np.asarray(r.out, np.float64) > 0, 1.0 / (1.0 - p), 0.0), P


def test_dropout_forward_and_backward_replay(rng):
    p = 0.3
    q = rng.standard_normal((2, 2, 16, 8))
    k = rng.standard_normal((2, 2, 24, 8))
    v = rng.standard_normal((2, 2, 24, 8))
    fwd = sdpa.scaled_dot_product_attention_with_lse(q, k, v, dropout_p=p, is_causal=True)
    D, P = dropout_multiplier(q, k, p, fwd.dropout_state, is_causal=True)
    kept = D[P > 0] > 0
    assert 0.55 < kept.mean() < 0.85  # about 1 - p of the weights survive
    want = ref.forward(q, k, v, is_causal=True, dropout=D)[0]
    np.testing.assert_allclose(fwd.out, want, atol=1e-10, rtol=1e-9)
    g = rng.standard_normal(fwd.out.shape)
    grads = sdpa.scaled_dot_product_attention_backward(
        g, q, k, v, fwd.out, fwd.lse, dropout_p=p, is_causal=True,
        dropout_state=fwd.dropout_state)
    want = ref.backward(g, q, k, v, is_causal=True, dropout=D)
    for got, expected in zip(grads[:3], want[:3]):
        np.testing.assert_allclose(got, expected, atol=1e-10, rtol=1e-9)


def test_dropout_position_draws_the_whole_calls_mask(rng):
    # A block of queries [a, b) x keys [c, d) drawn at its position keeps exactly the
    # whole call's weights there (context parallelism's pieces).
    p, state, L, S = 0.4, (99, 2), 20, 30
    q = rng.standard_normal((2, 3, L, 8))
    k = rng.standard_normal((2, 3, S, 8))
    whole, _ = dropout_multiplier(q, k, p, state)
    for (a, b), (c, d) in [((0, L), (0, S)), ((5, 13), (7, S)), ((L - 1, L), (0, 1))]:
        eye = np.broadcast_to(np.eye(d - c), k.shape[:-2] + (d - c, d - c))
        r = sdpa.scaled_dot_product_attention_with_lse(
            q[..., a:b, :], k[..., c:d, :], eye, dropout_p=p, dropout_state=state,
            dropout_position=(a, c, L, S))
        np.testing.assert_array_equal(np.where(np.asarray(r.out) > 0, 1.0 / (1.0 - p), 0.0),
                                      whole[..., a:b, c:d])
    with pytest.raises(TypeError, match="dropout_position"):
        sdpa.scaled_dot_product_attention_with_lse(q, k, k, dropout_p=p, dropout_position=(0, 0, L))
    with pytest.raises(sdpa.Error, match="dropout_position"):
        sdpa.scaled_dot_product_attention_with_lse(q, k, k, dropout_p=p,
                                                   dropout_position=(1, 0, L, S))


def test_generators(rng):
    q = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    sdpa.manual_seed(123)
    a = sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    b = sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.5)  # the offset advanced
    sdpa.manual_seed(123)
    assert sdpa.default_generator.initial_seed() == 123
    np.testing.assert_array_equal(a, sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.5))
    assert not np.array_equal(a, b)
    g1, g2 = sdpa.Generator(5), sdpa.Generator(5)
    np.testing.assert_array_equal(
        sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.5, generator=g1),
        sdpa.scaled_dot_product_attention(q, q, q, dropout_p=0.5, generator=g2))
    state = sdpa.Generator(9).next_state()
    assert state == (9, 0)
    r = sdpa.scaled_dot_product_attention_with_lse(q, q, q, dropout_p=0.5,
                                                   generator=sdpa.Generator(9))
    assert r.dropout_state == (9, 0)
    assert sdpa.scaled_dot_product_attention_with_lse(q, q, q).dropout_state == (0, 0)
    assert g1.manual_seed(3).initial_seed() == 3


def test_deterministic_flag():
    assert not sdpa.are_deterministic_algorithms_enabled()
    sdpa.use_deterministic_algorithms(True)
    try:
        assert sdpa.are_deterministic_algorithms_enabled()
        q = np.ones((1, 1, 3, 4), np.float32)
        np.testing.assert_allclose(sdpa.scaled_dot_product_attention(q, q, q), q)
    finally:
        sdpa.use_deterministic_algorithms(False)


def test_threads_and_memory_stats():
    n = sdpa.get_num_threads()
    assert n >= 1
    sdpa.set_num_threads(1)
    try:
        assert sdpa.get_num_threads() == 1
    finally:
        sdpa.set_num_threads(n)
    with pytest.raises(ValueError):
        sdpa.set_num_threads(0)
    stats = sdpa.memory_stats()
    assert set(stats) == {"current_bytes", "peak_bytes", "cached_bytes"}
    sdpa.reset_peak_memory()
    # A freed block of 2 MiB or more is cached for reuse until empty_cache().
    sdpa.empty_cache()
    assert sdpa.memory_stats()["cached_bytes"] == 0
    q = np.ones((1, 1, 1 << 16, 16), np.float32)  # out: 4 MiB
    out = sdpa.scaled_dot_product_attention(q, q[:, :, :8], q[:, :, :8])
    del out
    assert sdpa.memory_stats()["cached_bytes"] >= 4 << 20
    sdpa.empty_cache()
    assert sdpa.memory_stats()["cached_bytes"] == 0


def test_info_module():
    run = subprocess.run([sys.executable, "-m", "sdpa.info"], capture_output=True, text=True,
                         check=True)
    lines = run.stdout.splitlines()
    assert lines[0] == f"sdpa {sdpa.__version__}"
    assert lines[1].startswith("cpu capability: ")
    assert lines[2].startswith("amx bf16: ")
    assert lines[3].startswith("openmp: ")
    assert "backends in priority order (probe: a float32 cpu call):" in run.stdout
    for name in ("MATH", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
        assert any(line.strip().startswith(name) for line in lines)
    assert sdpa.info.text() == run.stdout
    assert subprocess.run([sys.executable, "-m", "sdpa"], capture_output=True, text=True,
                          check=True).stdout == run.stdout


def test_version():
    assert sdpa.__version__.count(".") == 2


def _cli():
    import os
    import pathlib

    path = os.environ.get("SDPA_CLI") or str(
        pathlib.Path(__file__).resolve().parents[2] / "build" / "release" / "tools" / "sdpa")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@pytest.mark.skipif(_cli() is None, reason="the sdpa CLI is not built (build/release/tools/sdpa)")
def test_info_module_prints_what_the_cli_prints():
    cli = subprocess.run([_cli(), "info"], capture_output=True, text=True, check=True).stdout
    py = subprocess.run([sys.executable, "-m", "sdpa.info"], capture_output=True, text=True,
                        check=True).stdout
    assert py == cli
