"""The sdpa::attention torch.library custom op: opcheck, autograd, torch.compile
(fullgraph, forward and backward), dropout replay, biases and DLPack with torch."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
import numpy as np  # noqa: E402

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402
from sdpa.attention import bias as B  # noqa: E402


def qkv(*shape_q, s=None, hkv=None, ev=None, dtype=torch.float32, seed=0, grad=True):
    gen = torch.Generator().manual_seed(seed)
    *lead, h, L, E = shape_q
    S = s or L
    hk = hkv or h
    q = torch.randn(*lead, h, L, E, generator=gen, dtype=dtype)
    k = torch.randn(*lead, hk, S, E, generator=gen, dtype=dtype)
    v = torch.randn(*lead, hk, S, ev or E, generator=gen, dtype=dtype)
    return [x.requires_grad_(grad) for x in (q, k, v)]


def op_args(q, k, v, mask=None, bias=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False):
    return (q, k, v, mask, bias, dropout_p, is_causal, scale, enable_gqa, 0, -1)


@pytest.mark.parametrize("sample", [
    "plain", "causal_gqa", "float_mask", "bool_mask", "bias_spec", "unbatched", "bfloat16"])
def test_opcheck(sample):
    q, k, v = qkv(2, 4, 5, 8, s=7, hkv=2 if sample == "causal_gqa" else None,
                  dtype=torch.bfloat16 if sample == "bfloat16" else torch.float32)
    args = {
        "plain": lambda: op_args(q, k, v),
        "bfloat16": lambda: op_args(q, k, v, scale=0.5),
        "causal_gqa": lambda: op_args(q, k, v, is_causal=True, enable_gqa=True),
        "float_mask": lambda: op_args(q, k, v, mask=torch.randn(5, 7, requires_grad=True)),
        "bool_mask": lambda: op_args(q, k, v, mask=torch.rand(2, 1, 5, 7) < 0.7),
        "bias_spec": lambda: op_args(q, k, v, bias=B.causal_lower_right(5, 7)._spec),
        "unbatched": lambda: op_args(q[0], k[0], v[0], is_causal=True),
    }[sample]()
    torch.library.opcheck(torch.ops.sdpa.attention.default, args)


def test_opcheck_backward():
    q, k, v = qkv(2, 2, 5, 8, s=6, grad=False)
    out, lse, info = torch.ops.sdpa.attention(*op_args(q, k, v, is_causal=True))
    mask = torch.randn(2, 2, 5, 6)
    out_m, lse_m, info_m = torch.ops.sdpa.attention(*op_args(q, k, v, mask=mask))
    g = torch.randn_like(out)
    for args in [
        (g, q, k, v, out, lse, info, None, None, 0.0, True, None, False, False),
        (g, q, k, v, out_m, lse_m, info_m, mask, None, 0.0, False, None, False, True),
    ]:
        torch.library.opcheck(torch.ops.sdpa.attention_backward.default, args)


def test_outputs_and_lse():
    q, k, v = qkv(2, 3, 6, 8)
    r = sdpa.scaled_dot_product_attention_with_lse(q, k, v, is_causal=True)
    assert isinstance(r, sdpa.AttentionOutput)
    assert r.out.requires_grad and not r.lse.requires_grad
    assert r.lse.dtype == torch.float32 and r.lse.shape == (2, 3, 6)
    assert r.backend == sdpa.SDPBackend.FLASH_ATTENTION
    scores = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(
        ~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(r.lse, torch.logsumexp(scores, -1).detach())
    with sdpa.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):  # torch's enum works too
        assert sdpa.scaled_dot_product_attention_with_lse(q, k, v).backend == sdpa.SDPBackend.MATH
    r.out.sum().backward()
    assert q.grad is not None


def test_backward_function_with_torch_tensors():
    q, k, v = qkv(2, 3, 6, 8)
    r = sdpa.scaled_dot_product_attention_with_lse(q, k, v)
    g = torch.randn_like(r.out)
    grads = sdpa.scaled_dot_product_attention_backward(g, q, k, v, r.out, r.lse)
    assert all(isinstance(x, torch.Tensor) for x in grads[:3]) and grads.grad_attn_mask is None
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k, v), g)
    for a, b in zip(grads[:3], want):
        torch.testing.assert_close(a, b)


def test_dlpack_is_zero_copy_for_torch():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = torch.randn(2, 3, 4, 8).to(dtype)
        t = sdpa.Tensor.from_dlpack(x)
        assert t.data_ptr == x.data_ptr() and t.dtype == str(dtype).removeprefix("torch.")
        y = torch.from_dlpack(t)
        assert y.data_ptr() == x.data_ptr() and y.dtype == dtype
    x = torch.randn(4, 8, requires_grad=True)  # requires_grad tensors are read through detach
    assert sdpa.Tensor.from_dlpack(x).data_ptr == x.data_ptr()


def compiled_and_eager(fn, *inputs, backend="inductor"):
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    eager_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    loss_c = compiled(*inputs)
    loss_e = fn(*eager_inputs)
    loss_c.backward()
    loss_e.backward()
    torch.testing.assert_close(loss_c, loss_e)
    for a, b in zip(inputs, eager_inputs):
        if a.requires_grad:
            torch.testing.assert_close(a.grad, b.grad)
    return compiled


@pytest.mark.slow
def test_torch_compile_fullgraph_forward_and_backward():
    q, k, v = qkv(2, 4, 16, 32, hkv=2)
    mask = torch.randn(16, 16, requires_grad=True)

    def layer(q, k, v, mask):
        a = sdpa.scaled_dot_product_attention(q.tanh(), k, v, attn_mask=mask, enable_gqa=True)
        b = sdpa.torch.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                    scale=0.3)
        return (a * b).sum() + a.square().mean()

    compiled_and_eager(layer, q, k, v, mask)


@pytest.mark.slow
def test_torch_compile_with_native_bias_and_dynamic_shapes():
    bias = B.compose(B.causal_lower_right(8, 12), B.AlibiBias(4))

    def layer(q, k, v):
        return sdpa.scaled_dot_product_attention(q, k, v, attn_mask=bias).pow(2).sum()

    compiled_and_eager(layer, *qkv(2, 4, 8, 16, s=12), backend="aot_eager")
    # torch's own CausalBias travels as a spec too.
    import torch.nn.attention.bias as tb

    causal = tb.causal_lower_right(8, 12)
    compiled_and_eager(
        lambda q, k, v: sdpa.scaled_dot_product_attention(q, k, v, attn_mask=causal).sum(),
        *qkv(2, 4, 8, 16, s=12, seed=1), backend="aot_eager")

    def dyn(q, k, v):
        return sdpa.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    compiled = torch.compile(dyn, fullgraph=True, dynamic=True, backend="aot_eager")
    for L in (5, 9, 13):
        q, k, v = qkv(1, 2, L, 8, seed=L)
        compiled(q, k, v).backward()
        want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True).sum(),
                                   q)[0]
        torch.testing.assert_close(q.grad, want)


def test_python_bias_is_materialized_for_the_op():
    class Banded(B.AttnBias):
        def materialize(self, shape, dtype):
            i = torch.arange(shape[2])[:, None]
            j = torch.arange(shape[3])[None, :]
            return (i - j).abs() <= 1

    q, k, v = qkv(2, 2, 6, 8)
    got = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=Banded())
    dense = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).abs() <= 1
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)),
                    torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b)
    # A composition with a dense tensor materializes as a whole; 3-D inputs too.
    both = B.compose(B.causal_upper_left(6, 6), dense)
    torch.testing.assert_close(
        sdpa.scaled_dot_product_attention(q[0], k[0], v[0], attn_mask=both),
        F.scaled_dot_product_attention(q[0], k[0], v[0], attn_mask=dense.tril()))


def dropout_multiplier(q, k, p, state, **options):
    """The [.., L, S] multiplier (0 or 1/(1-p)) of a dropout call with `state`, read back
    by attending to V = identity."""
    S = k.shape[-2]
    eye = torch.eye(S, dtype=q.dtype).expand(*k.shape[:-2], S, S)
    r = sdpa.scaled_dot_product_attention_with_lse(q.detach(), k.detach(), eye, dropout_p=p,
                                                   dropout_state=state, **options)
    return (r.out > 0).to(q.dtype) / (1 - p)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dropout_gradients_replay_the_forward_mask(dtype):
    p = 0.25
    q, k, v = qkv(2, 2, 12, 8, s=16, dtype=dtype, seed=5)
    sdpa.manual_seed(2024)
    r = sdpa.scaled_dot_product_attention_with_lse(q, k, v, dropout_p=p, is_causal=True)
    g = torch.randn_like(r.out)
    grads = torch.autograd.grad(r.out, (q, k, v), g)
    D = dropout_multiplier(q, k, p, r.dropout_state, is_causal=True)
    allowed = torch.ones(12, 16, dtype=torch.bool).tril()
    assert 0.6 < (D[..., allowed] > 0).float().mean() < 0.9  # about 1 - p survive
    # Reference with the same mask: softmax, multiply by D, @ V; autograd for gradients.
    scores = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    want = (scores.softmax(-1) * D) @ v
    tol = {"atol": 1e-10, "rtol": 1e-9} if dtype == torch.float64 else {}
    torch.testing.assert_close(r.out, want, **tol)
    for a, b in zip(grads, torch.autograd.grad(want, (q, k, v), g)):
        torch.testing.assert_close(a, b, **tol)
    # The plain function draws from the same default generator: same seed, same result.
    sdpa.manual_seed(2024)
    again = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    torch.testing.assert_close(again, r.out, atol=0, rtol=0)
    gen = sdpa.Generator(2024)
    with_gen = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                                 generator=gen)
    torch.testing.assert_close(with_gen, r.out, atol=0, rtol=0)


@pytest.mark.slow
def test_dropout_under_torch_compile_draws_at_run_time():
    q, k, v = qkv(1, 2, 8, 8, seed=9)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(q, k, v):
        return sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    a, b = f(q, k, v), f(q, k, v)
    assert not torch.equal(a, b)  # fresh randomness per call, not baked into the graph
    sdpa.manual_seed(1)
    c = f(q, k, v)
    sdpa.manual_seed(1)
    torch.testing.assert_close(c, f(q, k, v), atol=0, rtol=0)
    c.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_errors_with_torch_tensors():
    q, k, v = qkv(2, 2, 4, 8)
    with pytest.raises(ValueError, match="key: expected dtype float32"):
        sdpa.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(ValueError, match="attn_mask: expected no mask when is_causal"):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(4, 4, dtype=torch.bool),
                                          is_causal=True)
    with pytest.raises(TypeError, match="value: expected a torch.Tensor"):
        sdpa.scaled_dot_product_attention(q, k, [1.0])


@pytest.mark.slow
@pytest.mark.parametrize("order", ["import sdpa, torch", "import torch, sdpa"])
def test_compile_works_whichever_is_imported_first(order):
    # sdpa.torch is imported by sdpa/__init__ when torch is already loaded, and by the
    # first torch call otherwise (a plain import statement, which the tracer runs).
    import subprocess
    import sys

    code = order + """
q = torch.randn(1, 2, 5, 8, requires_grad=True)
f = torch.compile(lambda q: sdpa.scaled_dot_product_attention(q, q, q, is_causal=True).sum(),
                  fullgraph=True, backend="aot_eager")
f(q).backward()
want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
    q, q, q, is_causal=True).sum(), q)[0]
torch.testing.assert_close(q.grad, want)
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


# ---- eager calls skip the op: without gradients the kernel runs directly
# (sdpa.torch._runs_eagerly), with gradients through sdpa.torch._EagerAttention --------

def _eager_vs_op_cases():
    q, k, v = qkv(2, 4, 7, 16, s=65, hkv=2, grad=False, seed=3)
    mask = torch.randn(2, 1, 7, 65)
    return [
        dict(args=(q, k, v), kw=dict(is_causal=True, enable_gqa=True)),
        dict(args=(q, k, v), kw=dict(attn_mask=mask, enable_gqa=True, scale=0.3)),
        dict(args=(q, k, v), kw=dict(attn_mask=B.causal_lower_right(7, 65), enable_gqa=True)),
    ]


def _through_op(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                dropout_p=0.0):
    """(out, lse) of the sdpa::attention op itself, differentiable through its autograd."""
    mask, spec = sdpa.torch._mask_args(attn_mask, q, k)
    out, lse, _ = torch.ops.sdpa.attention(q, k, v, mask, spec, dropout_p, is_causal, scale,
                                           enable_gqa, 0, -1)
    return out, lse


@pytest.mark.parametrize("case", range(3))
def test_eager_calls_without_gradients_match_the_op(case):
    c = _eager_vs_op_cases()[case]
    q, k, v = c["args"]
    assert sdpa.torch._runs_eagerly(q, k, v, None)
    eager = sdpa.scaled_dot_product_attention_with_lse(q, k, v, **c["kw"])
    out, lse = _through_op(q, k, v, **c["kw"])
    torch.testing.assert_close(eager.out, out, atol=0, rtol=0)
    torch.testing.assert_close(eager.lse, lse, atol=0, rtol=0)
    assert eager.backend == sdpa.SDPBackend.FLASH_ATTENTION
    qg = q.clone().requires_grad_()
    assert not sdpa.torch._runs_eagerly(qg, k, v, None)  # a gradient to track
    assert sdpa.torch._autograd_eagerly(qg, k, v, None)
    with torch.no_grad():  # no_grad also runs eagerly, with tensors that require grad
        assert sdpa.torch._runs_eagerly(qg, k, v, None)
        torch.testing.assert_close(sdpa.scaled_dot_product_attention(qg, k, v, **c["kw"]),
                                   eager.out, atol=0, rtol=0)


@pytest.mark.parametrize("case", range(3))
def test_eager_gradients_match_the_op(case):
    c = _eager_vs_op_cases()[case]
    kw = dict(c["kw"])
    mask = kw.get("attn_mask")
    grads_of = [*(x.clone().requires_grad_() for x in c["args"])]
    if isinstance(mask, torch.Tensor):  # the float mask's gradient too
        grads_of.append(mask.clone().requires_grad_())
        kw["attn_mask"] = grads_of[3]
    eager = sdpa.scaled_dot_product_attention_with_lse(*grads_of[:3], **kw)
    assert eager.out.requires_grad and not eager.lse.requires_grad
    g = torch.randn(eager.out.shape, generator=torch.Generator().manual_seed(8))
    want = torch.autograd.grad(_through_op(*grads_of[:3], **kw)[0], grads_of, g)
    got = torch.autograd.grad(eager.out, grads_of, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # Second derivatives: the eager path and the op agree (both differentiate the math
    # formula; test_double_backward.py checks it against finite differences).
    second = []
    for run in (lambda: sdpa.scaled_dot_product_attention(*grads_of[:3], **kw),
                lambda: _through_op(*grads_of[:3], **kw)[0]):
        gq = torch.autograd.grad(run(), grads_of[0], g, create_graph=True)[0]
        second.append(torch.autograd.grad((gq * gq).sum(), grads_of))
    for a, b in zip(*second):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_eager_dropout_gradients_replay_the_forward_mask():
    q, k, v = qkv(1, 2, 9, 8, s=33, seed=4)
    sdpa.manual_seed(5)
    out = sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    got = torch.autograd.grad(out, (q, k, v), g)
    sdpa.manual_seed(5)
    want = torch.autograd.grad(_through_op(q, k, v, dropout_p=0.3)[0], (q, k, v), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_eager_dropout_draws_like_the_op_and_replays():
    q, k, v = qkv(1, 2, 9, 8, s=33, grad=False, seed=4)
    sdpa.manual_seed(77)
    eager = sdpa.scaled_dot_product_attention_with_lse(q, k, v, dropout_p=0.4)
    sdpa.manual_seed(77)
    out, _ = _through_op(q, k, v, dropout_p=0.4)
    torch.testing.assert_close(eager.out, out, atol=0, rtol=0)
    replay = sdpa.scaled_dot_product_attention_with_lse(q, k, v, dropout_p=0.4,
                                                        dropout_state=eager.dropout_state)
    torch.testing.assert_close(replay.out, eager.out, atol=0, rtol=0)


def test_tracers_and_modes_still_see_the_op():
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import TorchDispatchMode

    q, k, v = qkv(1, 2, 5, 8, grad=False)

    def f(q, k, v):
        return sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)

    graph = make_fx(f)(q, k, v)  # real tensors under make_fx's dispatch mode
    assert "sdpa.attention" in str(graph.code)

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as mode:
        out = f(q, k, v)
    assert any("sdpa.attention" in op for op in mode.ops)
    torch.testing.assert_close(out, f(q, k, v), atol=0, rtol=0)
    with torch.device("meta"):
        meta = sdpa.scaled_dot_product_attention(
            torch.empty(1, 2, 5, 8), torch.empty(1, 2, 5, 8), torch.empty(1, 2, 5, 8))
    assert meta.device.type == "meta" and meta.shape == (1, 2, 5, 8)


def test_tensors_on_different_devices_are_an_error():
    # The op's dispatch took cpu and meta tensors together and returned uninitialized memory.
    q = torch.randn(1, 2, 4, 8)
    meta = torch.empty(1, 2, 4, 8, device="meta")
    with pytest.raises(sdpa.Error,
                       match=r"key: expected device cpu \(the query device\), got meta"):
        sdpa.scaled_dot_product_attention(q, meta, meta)
    with pytest.raises(sdpa.Error, match="value: expected device cpu"):
        sdpa.scaled_dot_product_attention(q, q, meta)
    with pytest.raises(sdpa.Error, match="attn_mask: expected device cpu"):
        sdpa.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool,
                                                                        device="meta"))
    with pytest.raises(sdpa.Error, match="key: expected device meta"):
        sdpa.scaled_dot_product_attention(meta, q.requires_grad_(), q)


# ---- the eager fast path (sdpa._C.torch_eager_attention): odd shapes, strides, GQA and
# masks against the float64 reference; what it must leave to the general path ------------

def _strided(t, kind):
    """`t`'s values in a tensor with unusual strides: "bshd" (heads and sequence swapped in
    memory), "every_other" (a step-2 slice), "broadcast" (batch stride 0, from expand)."""
    if kind == "bshd":
        return t.transpose(-3, -2).contiguous().transpose(-3, -2)
    if kind == "every_other":
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    if kind == "broadcast":
        return t[:1].expand(t.shape)
    return t


def _fast_cases():
    """(name, q, k, v, kwargs): every call here takes the fast path."""
    gen = torch.Generator().manual_seed(11)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen, dtype=dtype)

    bool_mask = torch.rand(7, 11, generator=gen) < 0.6
    bool_mask[2] = False  # a fully masked row gives zeros
    return [
        ("tiny", rand(1, 1, 1, 8), rand(1, 1, 1, 8), rand(1, 1, 1, 8), {}),
        ("odd_shapes_ev", rand(3, 5, 7, 13), rand(3, 5, 11, 13), rand(3, 5, 11, 5), {}),
        ("gqa_causal", rand(2, 6, 9, 16), rand(2, 2, 9, 16), rand(2, 2, 9, 16),
         dict(enable_gqa=True, is_causal=True)),
        ("bshd_strides", _strided(rand(2, 3, 7, 16), "bshd"), _strided(rand(2, 3, 11, 16), "bshd"),
         _strided(rand(2, 3, 11, 16), "bshd"), dict(scale=0.37)),
        ("step_and_broadcast", _strided(rand(2, 3, 7, 8), "every_other"),
         _strided(rand(2, 3, 11, 8), "broadcast"), _strided(rand(2, 3, 11, 8), "every_other"), {}),
        ("bool_mask", rand(2, 3, 7, 8), rand(2, 3, 11, 8), rand(2, 3, 11, 8),
         dict(attn_mask=bool_mask)),
        ("float_mask_gqa", rand(2, 4, 7, 8), rand(2, 1, 11, 8), rand(2, 1, 11, 8),
         dict(attn_mask=rand(2, 1, 7, 11), enable_gqa=True)),
        ("unbatched_causal_l_ne_s", rand(3, 5, 8), rand(3, 9, 8), rand(3, 9, 8),
         dict(is_causal=True)),
        ("float64", rand(2, 2, 5, 8, dtype=torch.float64), rand(2, 2, 6, 8, dtype=torch.float64),
         rand(2, 2, 6, 8, dtype=torch.float64), dict(scale=0.5)),
        # Python numbers as torch's function takes them: ints, numpy scalars.
        ("loose_numbers", rand(1, 2, 3, 8), rand(1, 2, 3, 8), rand(1, 2, 3, 8),
         dict(dropout_p=0, is_causal=1, scale=np.float64(0.25), enable_gqa=0)),
    ]


@pytest.fixture(params=["exchange_table", "capsules"])
def dlpack_route(request):
    """Runs a test through torch's DLPack C exchange table and again through
    torch._C._to_dlpack / _from_dlpack capsules (a torch before 2.10)."""
    if request.param == "capsules":
        assert not sdpa.torch._register_torch(None)
        request.addfinalizer(sdpa.torch._register_torch)
    else:
        assert sdpa.torch._register_torch() == hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    return request.param


@pytest.mark.parametrize("case", [c[0] for c in _fast_cases()])
def test_eager_fast_path_matches_float64_reference(case, dlpack_route):
    import attention_reference as ref

    _, q, k, v, kw = next(c for c in _fast_cases() if c[0] == case)
    mask = kw.get("attn_mask")
    assert sdpa.torch._route(q, k, v, mask) == sdpa.torch._DIRECT
    args = (kw.get("dropout_p", 0.0), kw.get("is_causal", False), kw.get("scale"),
            kw.get("enable_gqa", False), None)
    fast = sdpa._C.torch_eager_attention(q, k, v, mask, *args, True)
    assert fast is not None  # this call takes the fast path
    out = sdpa.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(out, fast[0], atol=0, rtol=0)
    want_out, want_lse, _ = ref.forward(
        q.numpy(), k.numpy(), v.numpy(), None if mask is None else mask.numpy(),
        bool(kw.get("is_causal", False)), kw.get("scale"), bool(kw.get("enable_gqa", False)))
    tol = ref.tolerance(q.numpy().dtype)
    np.testing.assert_allclose(out.numpy(), want_out, **tol)
    np.testing.assert_allclose(fast[1].numpy(), want_lse, **ref.tolerance(np.float32))
    assert out.shape == (*q.shape[:-1], v.shape[-1]) and out.dtype == q.dtype
    assert out.is_contiguous() and out.data_ptr() not in (q.data_ptr(), k.data_ptr(),
                                                          v.data_ptr())
    with_lse = sdpa.scaled_dot_product_attention_with_lse(q, k, v, **kw)
    assert with_lse.backend == fast[2] and with_lse.dropout_state == fast[3]
    torch.testing.assert_close(with_lse.lse, fast[1], atol=0, rtol=0)


@pytest.mark.parametrize("case", ["odd_shapes_ev", "gqa_causal", "bshd_strides",
                                  "step_and_broadcast", "float_mask_gqa"])
def test_eager_gradients_match_float64_reference(case, dlpack_route):
    import attention_reference as ref

    _, q, k, v, kw = next(c for c in _fast_cases() if c[0] == case)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    mask = kw.get("attn_mask")
    if mask is not None:
        kw = dict(kw, attn_mask=mask.clone().requires_grad_())
        leaves.append(kw["attn_mask"])
    assert sdpa.torch._route(*leaves[:3], kw.get("attn_mask")) == sdpa.torch._AUTOGRAD
    out = sdpa.scaled_dot_product_attention(*leaves[:3], **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    got = torch.autograd.grad(out, leaves, g)
    want = ref.backward(g.numpy(), q.numpy(), k.numpy(), v.numpy(),
                        None if mask is None else mask.numpy(), kw.get("is_causal", False),
                        kw.get("scale"), kw.get("enable_gqa", False))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b, atol=1e-4, rtol=1e-3)


def test_eager_fast_path_with_a_generator_draws_like_the_op():
    q, k, v = qkv(1, 2, 9, 8, s=33, grad=False, seed=6)
    fast = sdpa.scaled_dot_product_attention_with_lse(q, k, v, dropout_p=0.4,
                                                      generator=sdpa.Generator(123))
    seed, offset = sdpa.Generator(123).next_state()
    assert fast.dropout_state == (seed, offset)
    out, _, _ = torch.ops.sdpa.attention(q, k, v, None, None, 0.4, False, None, False,
                                         sdpa.torch._signed(seed), offset)
    torch.testing.assert_close(fast.out, out, atol=0, rtol=0)


def test_eager_fast_path_leaves_other_calls_to_the_general_path():
    q, k, v = qkv(1, 2, 5, 8, grad=False)
    fast = sdpa._C.torch_eager_attention

    class Sub(torch.Tensor):
        pass

    assert fast(q.requires_grad_(), k, v, None, 0.0, False, None, False, None, False) is None
    q.requires_grad_(False)
    for mask in (B.causal_upper_left(5, 5), torch.ones(5, 5, dtype=torch.bool).as_subclass(Sub),
                 np.ones((5, 5), dtype=bool)):
        assert fast(q, k, v, mask, 0.0, False, None, False, None, False) is None
    assert fast(q.as_subclass(Sub), k, v, None, 0.0, False, None, False, None, False) is None
    assert fast(q, k, [1.0], None, 0.0, False, None, False, None, False) is None
    assert fast(q, k, v, None, "0.0", False, None, False, None, False) is None
    assert fast(q, k, v, None, 0.0, False, None, False, "not a generator", False) is None
    with torch.device("meta"):  # a __torch_function__ mode
        assert fast(q, k, v, None, 0.0, False, None, False, None, False) is None
    # ... and the general path answers them as before.
    want = sdpa.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(sdpa.scaled_dot_product_attention(q, k, v, dropout_p=np.float32(0)),
                               want, atol=0, rtol=0)
    with pytest.raises(TypeError, match="generator: expected an sdpa.Generator or None"):
        sdpa.scaled_dot_product_attention(q, k, v, dropout_p=0.5, generator="not a generator")
    with pytest.raises(sdpa.Error, match=r"dropout_state: expected seed and offset in"):
        sdpa.scaled_dot_product_attention_with_lse(q, k, v, dropout_p=0.5,
                                                   dropout_state=(-1, 2**70))
    # A string is not a number, as in torch (float() would take "0.0").
    with pytest.raises(TypeError, match="dropout_p: expected a number, got str '0.0'"):
        sdpa.scaled_dot_product_attention(q, k, v, dropout_p="0.0")
    sub = sdpa.scaled_dot_product_attention(q.as_subclass(Sub), k, v)
    torch.testing.assert_close(sub.as_subclass(torch.Tensor), want, atol=0, rtol=0)


def test_eager_fast_path_errors_name_the_argument_and_keep_inputs_alive():
    q, k, v = qkv(2, 2, 4, 8, grad=False)
    with pytest.raises(sdpa.Error, match="^key: "):
        sdpa.scaled_dot_product_attention(q, k.to(torch.int8), v)
    with pytest.raises(sdpa.Error, match="attn_mask"):
        sdpa.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 3))
    # Temporaries die right after the call: the result must not depend on them.
    out = sdpa.scaled_dot_product_attention(q.clone(), k.clone(), v.clone())
    torch.testing.assert_close(out, sdpa.scaled_dot_product_attention(q, k, v))
