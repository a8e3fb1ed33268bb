"""torch's own backend guard (torch.nn.attention.sdpa_kernel) and torch.backends' SDPA
switches restrict sdpa's torch entry points (mapped by backend name) unless an sdpa guard
is active."""

import contextlib
import threading

import pytest

torch = pytest.importorskip("torch")
from torch.nn.attention import SDPBackend as TorchBackend  # noqa: E402
from torch.nn.attention import sdpa_kernel as torch_sdpa_kernel  # noqa: E402

import sdpa  # noqa: E402
import sdpa.torch  # noqa: E402


def _inputs(requires_grad=False):
    g = torch.Generator().manual_seed(7)
    # Odd sizes, GQA off, float32: FLASH_ATTENTION is the CPU default for these.
    q, k, v = (torch.randn(2, 3, n, 33, generator=g, dtype=torch.float32) for n in (65, 70, 70))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _reference(q, k, v):
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    p = torch.softmax(q64 @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return p @ v64


@contextlib.contextmanager
def _torch_switches(**enabled):
    """torch.backends.cuda.enable_<name>_sdp(value) while the block runs."""
    old = {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in enabled}
    try:
        for name, value in enabled.items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(value)
        yield
    finally:
        for name, value in old.items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(value)


def test_without_a_guard_flash_runs():
    q, k, v = _inputs()
    assert sdpa.torch.scaled_dot_product_attention_with_lse(q, k, v).backend == \
        sdpa.SDPBackend.FLASH_ATTENTION


@pytest.mark.parametrize("torch_backend,expected", [
    (TorchBackend.MATH, sdpa.SDPBackend.MATH),
    (TorchBackend.FLASH_ATTENTION, sdpa.SDPBackend.FLASH_ATTENTION),
    ([TorchBackend.EFFICIENT_ATTENTION, TorchBackend.MATH], sdpa.SDPBackend.MATH),
])
def test_torch_guard_picks_the_backend(torch_backend, expected):
    q, k, v = _inputs()
    with torch_sdpa_kernel(torch_backend):
        result = sdpa.torch.scaled_dot_product_attention_with_lse(q, k, v)
        out = sdpa.torch.scaled_dot_product_attention(q, k, v)
    assert result.backend == expected
    ref = _reference(q, k, v)
    assert (result.out.double() - ref).abs().max().item() < 1e-5
    assert (out.double() - ref).abs().max().item() < 1e-5


def test_torch_guard_holds_for_the_autograd_path():
    q, k, v = _inputs(requires_grad=True)
    with torch_sdpa_kernel(TorchBackend.MATH):
        result = sdpa.torch.scaled_dot_product_attention_with_lse(q, k, v)
    assert result.backend == sdpa.SDPBackend.MATH
    result.out.sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    p = torch.softmax(q64 @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    (p @ v64).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert (got.double() - want).abs().max().item() < 1e-4


def test_sdpa_guard_wins_over_torch_guard():
    q, k, v = _inputs()
    with torch_sdpa_kernel(TorchBackend.MATH), sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
        result = sdpa.torch.scaled_dot_product_attention_with_lse(q, k, v)
    assert result.backend == sdpa.SDPBackend.FLASH_ATTENTION


def test_torch_backends_switches_count_as_torch_guard():
    q, k, v = _inputs()
    with _torch_switches(flash=False):
        assert sdpa.torch.scaled_dot_product_attention_with_lse(q, k, v).backend == \
            sdpa.SDPBackend.MATH
    assert sdpa.torch.scaled_dot_product_attention_with_lse(q, k, v).backend == \
        sdpa.SDPBackend.FLASH_ATTENTION


def test_torch_guard_without_a_cpu_backend_is_an_error():
    q, k, v = _inputs()
    with torch_sdpa_kernel(TorchBackend.CUDNN_ATTENTION), pytest.raises(sdpa.Error):
        sdpa.torch.scaled_dot_product_attention(q, k, v)


@pytest.mark.skipif(not hasattr(torch._C, "_set_sdp_use_overrideable"),
                    reason="this torch has no OVERRIDEABLE switch")
def test_every_torch_backend_off_is_an_error_naming_torch():
    q, k, v = _inputs()
    overrideable = torch._C._get_overrideable_sdp_enabled()
    torch._C._set_sdp_use_overrideable(False)
    try:
        with _torch_switches(math=False, flash=False, mem_efficient=False, cudnn=False), \
                pytest.raises(sdpa.Error, match="torch.nn.attention"):
            sdpa.torch.scaled_dot_product_attention(q, k, v)
    finally:
        torch._C._set_sdp_use_overrideable(overrideable)


def _record_guards(monkeypatch, name):
    """The calling thread's sdpa_kernel restriction each time sdpa._C.<name> runs."""
    seen = []
    real = getattr(sdpa._C, name)

    def recording(*args, **kwargs):
        seen.append(sdpa._C.active_backends() if sdpa._C.sdpa_kernel_active() else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa._C, name, recording)
    return seen


def _backward_on_another_thread(loss):
    # torch's autograd engine runs the backward of CUDA tensors on a thread of its own,
    # where the forward's thread-local guard is not active.
    failures = []

    def run():
        try:
            loss.backward()
        except Exception as err:  # noqa: BLE001 - re-raised on the test's thread
            failures.append(err)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if failures:
        raise failures[0]


def _forward(kind, q, k, v):
    if kind == "op":
        return torch.ops.sdpa.attention(q, k, v, None, None, 0.0, False, None, False, 0, -1)[0]
    if kind == "eager":
        return sdpa.torch.scaled_dot_product_attention(q, k, v)
    return sdpa.flex.flex_attention(q, k, v, score_mod=sdpa.flex.mods.soft_cap(20.0))


@pytest.mark.parametrize("kind", ["op", "eager", "flex"])
def test_a_backward_runs_under_its_forwards_guard_on_any_thread(monkeypatch, kind):
    seen = _record_guards(monkeypatch, "flex_attention_backward" if kind == "flex"
                          else "torch_attention_backward")
    q, k, v = _inputs(requires_grad=True)
    with sdpa.sdpa_kernel([sdpa.SDPBackend.MATH, sdpa.SDPBackend.FLASH_ATTENTION],
                          set_priority=True):
        out = _forward(kind, q, k, v)
    _backward_on_another_thread(out.sum())
    assert seen == [[sdpa.SDPBackend.MATH, sdpa.SDPBackend.FLASH_ATTENTION]]
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    # Without a guard the backward runs unrestricted.
    seen.clear()
    _forward(kind, q, k, v).sum().backward()
    assert seen == [None]


def test_a_backward_keeps_torchs_guard_of_its_forward(monkeypatch):
    seen = _record_guards(monkeypatch, "torch_attention_backward")
    q, k, v = _inputs(requires_grad=True)
    with torch_sdpa_kernel([TorchBackend.FLASH_ATTENTION, TorchBackend.MATH]):
        out = sdpa.torch.scaled_dot_product_attention(q, k, v)
    out.sum().backward()
    # In sdpa's default order, not the order torch's switches are listed in.
    order = [b for b in sdpa._C.default_priority_order()
             if b in (sdpa.SDPBackend.MATH, sdpa.SDPBackend.FLASH_ATTENTION)]
    assert seen == [order]
