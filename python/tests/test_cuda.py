"""CUDA tensors: sdpa.cuda, streams, torch CUDA tensors end to end.

The first group needs no GPU and runs everywhere. The GPU group skips, printing why,
unless sdpa and torch both see a CUDA device; there every output and gradient is checked
against a float64 reference that torch computes on the CPU with the textbook formula.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import sdpa

torch = pytest.importorskip("torch")

# --------------------------------------------------------------------------------------
# Without a GPU.


def test_cuda_functions_answer():
    assert isinstance(sdpa.cuda.is_built(), bool)
    assert not sdpa.cuda.cudnn_is_built() or sdpa.cuda.is_built()
    count = sdpa.cuda.device_count()
    assert count >= 0
    assert sdpa.cuda.is_available() == (count > 0)
    assert (sdpa.cuda.unavailable_reason() == "") == sdpa.cuda.is_available()
    if not sdpa.cuda.is_built():
        assert "without CUDA" in sdpa.cuda.unavailable_reason()
    stats = sdpa.cuda.memory_stats(0)
    assert set(stats) == {"current_bytes", "peak_bytes"}
    assert 0 <= stats["current_bytes"] <= stats["peak_bytes"]
    sdpa.cuda.reset_peak_memory(0)
    cache = sdpa.cuda.graph_cache_stats()
    assert set(cache) == {"hits", "misses", "size", "capacity"}
    assert all(v >= 0 for v in cache.values())


@pytest.mark.skipif(sdpa.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_a_device_the_functions_say_so():
    with pytest.raises(sdpa.Error):
        sdpa.cuda.device_description(0)
    with pytest.raises(sdpa.Error):
        sdpa.cuda.synchronize()
    if sdpa.cuda.is_built():
        # The CI machines build with CUDA and have no GPU.
        assert sdpa.cuda.device_count() == 0


@pytest.mark.skipif(not sdpa.cuda.is_built(), reason="sdpa was built without CUDA")
def test_memory_stats_rejects_a_bad_device():
    with pytest.raises(sdpa.Error, match="device"):
        sdpa.cuda.memory_stats(-1)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_kDLCUDA, _kDLFloat = 2, 2
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@pytest.fixture
def cuda_capsule():
    """Returns make(shape): a "dltensor" capsule claiming to be a float32 tensor on cuda:0
    (its data is host memory that is never read without a device). No deleter: the
    structures live until the test ends."""
    keep = []

    def make(shape):
        host = np.zeros(shape, np.float32)
        dims = (ctypes.c_int64 * len(shape))(*shape)
        managed = _DLManagedTensor()
        managed.dl_tensor = _DLTensor(host.ctypes.data, _DLDevice(_kDLCUDA, 0), len(shape),
                                      _DLDataType(_kDLFloat, 32, 1), dims, None, 0)
        keep.extend((host, dims, managed))
        return _capsule_new(ctypes.addressof(managed), b"dltensor", None)

    return make


@pytest.mark.skipif(sdpa.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_tensor_without_a_device_raises_sdpa_error(cuda_capsule):
    shape = (1, 2, 3, 8)
    with pytest.raises(sdpa.Error) as failure:
        sdpa.scaled_dot_product_attention(cuda_capsule(shape), cuda_capsule(shape),
                                          cuda_capsule(shape))
    assert "cuda" in str(failure.value).lower()


def test_mixed_devices_name_the_argument(cuda_capsule):
    shape = (1, 2, 3, 8)
    host = np.ones(shape, np.float32)
    with pytest.raises(sdpa.Error, match="key: expected device cuda:0"):
        sdpa.scaled_dot_product_attention(cuda_capsule(shape), host, cuda_capsule(shape))
    with pytest.raises(sdpa.Error, match="value: expected device cpu"):
        sdpa.scaled_dot_product_attention(host, host, cuda_capsule(shape))


def test_explain_cuda_inputs_gives_every_backend_a_verdict(cuda_capsule):
    # explain allocates nothing on the device, so it answers without one.
    shape = (1, 2, 3, 8)
    for backward in (False, True):
        e = sdpa.explain(cuda_capsule(shape), cuda_capsule(shape), cuda_capsule(shape),
                         backward=backward)
        verdicts = {v.backend: v for v in e.verdicts}
        assert set(verdicts) == set(sdpa.SDPBackend.__members__.values()) - {
            sdpa.SDPBackend.ERROR}
        for v in verdicts.values():
            assert v.supported or v.reasons, v
        assert "cuda" in str(e)


def test_stream_argument_is_checked_and_ignored_on_the_cpu(rng):
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    expected = sdpa.scaled_dot_product_attention(q, q, q)
    np.testing.assert_array_equal(sdpa.scaled_dot_product_attention(q, q, q, stream=7),
                                  expected)
    for bad in ("0", -1, 1.5, True):
        with pytest.raises(TypeError, match="stream"):
            sdpa.scaled_dot_product_attention(q, q, q, stream=bad)
    t = torch.from_numpy(q)
    np.testing.assert_array_equal(
        sdpa.scaled_dot_product_attention(t, t, t, stream=7).numpy(), expected)
    with pytest.raises(TypeError, match="stream"):
        sdpa.scaled_dot_product_attention(t, t, t, stream="0")
    grads = sdpa.scaled_dot_product_attention_backward(t, t, t, t, t, torch.zeros(1, 2, 5),
                                                       stream=0)
    assert grads.grad_q.shape == t.shape


def test_cpu_tensor_dlpack_takes_a_stream_of_none(rng):
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    out = sdpa.scaled_dot_product_attention(sdpa.Tensor.from_dlpack(q), q, q)
    assert isinstance(out, sdpa.Tensor)
    assert not hasattr(out, "_stream")  # only CUDA results record their stream
    np.testing.assert_array_equal(np.from_dlpack(out),
                                  sdpa.scaled_dot_product_attention(q, q, q))


# --------------------------------------------------------------------------------------
# On a GPU.

gpu = pytest.mark.skipif(
    not (sdpa.cuda.is_available() and torch.cuda.is_available()),
    reason=sdpa.cuda.unavailable_reason() or "torch sees no CUDA device")

# Max-abs-error / max-abs-reference allowed per dtype: a few units in the last place of the
# output dtype. Gradients chain two more products in the input dtype: twice that.
FORWARD_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
GRAD_TOL = {dtype: 2 * tol for dtype, tol in FORWARD_TOL.items()}
GRAD_TOL[torch.float32] = 1e-4  # fp32 sums of up to 1000 products, twice over
DTYPES = list(FORWARD_TOL)
# (L, S): 1, primes and tile-width +-1, square and not.
SIZES = [(1, 1), (1, 1000), (7, 129), (127, 127), (129, 7), (127, 1000), (1000, 1000)]
HQ, HKV = 8, 2


def _randn(*shape, dtype, requires_grad=False):
    """Random normal CUDA tensor (never zeros, which would hide indexing errors)."""
    x = torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)
    return x.requires_grad_(requires_grad)


def _inputs(L, S, E, dtype, batch=2, requires_grad=False, bshd=False):
    """q [B, Hq, L, E], k / v [B, Hkv, S, E]; with bshd, transposed views of [B, L, H, E]
    storage (non-contiguous, as a model's projections give)."""
    if bshd:
        return tuple(_randn(batch, n, h, E, dtype=dtype).transpose(1, 2)
                     .requires_grad_(requires_grad)
                     for n, h in ((L, HQ), (S, HKV), (S, HKV)))
    return (_randn(batch, HQ, L, E, dtype=dtype, requires_grad=requires_grad),
            _randn(batch, HKV, S, E, dtype=dtype, requires_grad=requires_grad),
            _randn(batch, HKV, S, E, dtype=dtype, requires_grad=requires_grad))


def _reference(q, k, v, mask=None, is_causal=False):
    """(out, leaves) in float64 on the CPU: softmax(q k^T / sqrt(E) + mask) v with the
    key/value heads repeated for GQA; `leaves` are float64 copies requiring grad."""
    leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    if mask is not None:
        leaves.append(mask.detach().cpu().double().requires_grad_())
    q64, k64, v64 = leaves[:3]
    group = q64.shape[-3] // k64.shape[-3]
    k64, v64 = k64.repeat_interleave(group, -3), v64.repeat_interleave(group, -3)
    scores = q64 @ k64.transpose(-1, -2) / q64.shape[-1] ** 0.5
    if is_causal:
        L, S = scores.shape[-2:]
        keep = torch.ones(L, S, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        scores = scores + leaves[3]
    return torch.softmax(scores, -1) @ v64, leaves


def _relative_error(actual, expected):
    expected = expected.detach().double()
    return ((actual.detach().cpu().double() - expected).abs().max()
            / expected.abs().max().clamp_min(1e-30)).item()


def _expected_backend(dtype, E, mask):
    """The backend a forward call picks on an sm_80+ GPU."""
    half = dtype != torch.float32
    fused = sdpa.cuda.cudnn_is_built() and half and E in (64, 128)
    # cuDNN takes additive (float) masks; sdpa's own FLASH kernels any mask, forward.
    takes_mask = mask is None or mask.dtype != torch.bool
    if fused and takes_mask:
        return "CUDNN_ATTENTION"
    return "FLASH_ATTENTION" if half and E % 8 == 0 and E <= 256 else "MATH"


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L,S", SIZES)
@pytest.mark.parametrize("E", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
def test_forward_matches_float64(dtype, L, S, E, is_causal):
    q, k, v = _inputs(L, S, E, dtype)
    result = sdpa.scaled_dot_product_attention_with_lse(q, k, v, is_causal=is_causal,
                                                        enable_gqa=True)
    assert result.out.is_cuda and result.out.dtype == dtype
    assert result.out.shape == (2, HQ, L, E)
    assert result.backend.name == _expected_backend(dtype, E, None)
    expected, _ = _reference(q, k, v, is_causal=is_causal)
    assert _relative_error(result.out, expected) <= FORWARD_TOL[dtype]


@gpu
@pytest.mark.parametrize("L,S", SIZES)
def test_fp32_odd_head_dim_runs_math(L, S):
    q, k, v = _inputs(L, S, 72, torch.float32)
    result = sdpa.scaled_dot_product_attention_with_lse(q, k, v, enable_gqa=True)
    assert result.backend.name == "MATH"
    expected, _ = _reference(q, k, v)
    assert _relative_error(result.out, expected) <= FORWARD_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_float_mask_and_non_contiguous_inputs(dtype):
    L, S, E = 127, 129, 64
    q, k, v = _inputs(L, S, E, dtype, bshd=True)
    assert not q.is_contiguous()
    mask = _randn(2, 1, L, S, dtype=dtype)
    result = sdpa.scaled_dot_product_attention_with_lse(q, k, v, attn_mask=mask,
                                                        enable_gqa=True)
    assert result.backend.name == _expected_backend(dtype, E, mask)
    expected, _ = _reference(q, k, v, mask=mask)
    assert _relative_error(result.out, expected) <= FORWARD_TOL[dtype]


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L,S", [(1, 7), (7, 129), (127, 127), (129, 1000)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("bshd", [False, True])
def test_gradients_match_float64(dtype, L, S, is_causal, bshd):
    q, k, v = _inputs(L, S, 64, dtype, requires_grad=True, bshd=bshd)
    out = sdpa.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    expected, leaves = _reference(q, k, v, is_causal=is_causal)
    expected.backward(grad_out.cpu().double())
    # Errors relative to the largest reference gradient: a gradient that is exactly zero
    # (dq when each query sees one key, L=1 causal) comes back as rounding noise.
    scale = max(leaf.grad.abs().max().item() for leaf in leaves)
    for name, x, leaf in zip("qkv", (q, k, v), leaves):
        assert x.grad.is_cuda and x.grad.dtype == dtype
        error = (x.grad.detach().cpu().double() - leaf.grad).abs().max().item() / scale
        assert error <= GRAD_TOL[dtype], name


@gpu
def test_float_mask_gradient():
    q, k, v = _inputs(7, 129, 72, torch.float32, requires_grad=True)
    mask = _randn(2, 1, 7, 129, dtype=torch.float32, requires_grad=True)
    out = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    expected, leaves = _reference(q, k, v, mask=mask)
    expected.backward(grad_out.cpu().double())
    for x, leaf in zip((q, k, v, mask), leaves):
        assert _relative_error(x.grad, leaf.grad) <= GRAD_TOL[torch.float32]


@gpu
@pytest.mark.parametrize("how", ["current", "argument", "int"])
def test_non_default_stream(how):
    # Big enough that reading before the stream finishes would see unwritten memory.
    dtype = torch.bfloat16
    q, k, v = _inputs(1000, 1000, 128, dtype, batch=4, requires_grad=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    if how == "current":
        with torch.cuda.stream(side):
            out = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            out.backward(torch.ones_like(out))
    else:
        stream = side if how == "argument" else side.cuda_stream
        out = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True, stream=stream)
        with torch.cuda.stream(side):
            out.backward(torch.ones_like(out))  # autograd replays the forward's stream
    side.synchronize()
    expected, leaves = _reference(q, k, v)
    expected.backward(torch.ones_like(expected))
    assert _relative_error(out, expected) <= FORWARD_TOL[dtype]
    assert _relative_error(q.grad, leaves[0].grad) <= GRAD_TOL[dtype]


@gpu
def test_sdpa_tensor_dlpack_waits_for_its_stream():
    q, k, v = _inputs(1000, 1000, 128, torch.bfloat16, batch=4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    args = [sdpa.Tensor.from_dlpack(x) for x in (q, k, v)]
    out = sdpa.scaled_dot_product_attention(*args, enable_gqa=True, stream=side.cuda_stream)
    assert isinstance(out, sdpa.Tensor) and out.device == "cuda:0"
    # torch.from_dlpack passes its current (default) stream: __dlpack__ waits for `side`.
    result = torch.from_dlpack(out)
    expected, _ = _reference(q, k, v)
    assert _relative_error(result, expected) <= FORWARD_TOL[torch.bfloat16]


@gpu
def test_mixed_devices_raise_naming_the_argument():
    q, k, v = _inputs(7, 7, 64, torch.float32)
    with pytest.raises(sdpa.Error, match="key"):
        sdpa.scaled_dot_product_attention(q, k.cpu(), v, enable_gqa=True)
    with pytest.raises(sdpa.Error, match="value"):
        sdpa.scaled_dot_product_attention(q.cpu(), k.cpu(), v, enable_gqa=True)
    with pytest.raises(sdpa.Error, match="attn_mask"):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(7, 7),
                                          enable_gqa=True)
    with pytest.raises(sdpa.Error, match="key"):
        sdpa.scaled_dot_product_attention(sdpa.Tensor.from_dlpack(q), k.cpu(), v,
                                          enable_gqa=True)


@gpu
def test_explain_and_sdpa_kernel_on_cuda():
    q, k, v = _inputs(127, 129, 64, torch.bfloat16)
    for backward in (False, True):
        e = sdpa.explain(q, k, v, enable_gqa=True, backward=backward)
        verdicts = {v.backend: v for v in e.verdicts}
        assert set(verdicts) == set(sdpa.SDPBackend.__members__.values()) - {
            sdpa.SDPBackend.ERROR}
        for verdict in verdicts.values():
            assert verdict.supported or verdict.reasons, verdict
        assert e.chosen.name == _expected_backend(torch.bfloat16, 64, None)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
        result = sdpa.scaled_dot_product_attention_with_lse(q, k, v, enable_gqa=True)
    assert result.backend.name == "MATH"
    with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
        result = sdpa.scaled_dot_product_attention_with_lse(q, k, v, enable_gqa=True)
        assert result.backend.name == "FLASH_ATTENTION"
        expected, _ = _reference(q, k, v)
        assert _relative_error(result.out, expected) <= FORWARD_TOL[torch.bfloat16]
        # float32 has no FLASH kernel on CUDA: the error names the backend and the reason.
        with pytest.raises(sdpa.Error, match="FLASH_ATTENTION[^$]*dtype"):
            sdpa.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)


@gpu
def test_device_memory_and_description():
    assert torch.cuda.get_device_name(0) in sdpa.cuda.device_description(0)
    sdpa.cuda.reset_peak_memory(0)
    before = sdpa.cuda.memory_stats(0)["current_bytes"]
    q, k, v = _inputs(129, 129, 64, torch.float32)
    out = sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()
    stats = sdpa.cuda.memory_stats(0)
    assert stats["current_bytes"] >= before + out.numel() * out.element_size()
    assert stats["peak_bytes"] >= stats["current_bytes"]
    del out
    assert sdpa.cuda.memory_stats(0)["current_bytes"] <= stats["current_bytes"]
    sdpa.cuda.synchronize(torch.cuda.current_stream())
