"""Threads (numpy only): sdpa_kernel is per-thread, calls run concurrently, and the GIL
is released while the library computes."""

import threading
import time

import numpy as np

import sdpa
import attention_reference as ref
from sdpa.attention import bias as B


def run_threads(*targets):
    errors = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:
                errors.append(e)
        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def test_sdpa_kernel_is_per_thread(rng):
    q = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    inside, outside = threading.Barrier(2), threading.Barrier(2)
    seen = {}

    def guarded():
        with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
            inside.wait()  # the other thread runs while this guard is active
            seen["guarded"] = sdpa.scaled_dot_product_attention_with_lse(q, q, q).backend
            seen["guarded_active"] = sdpa.backends.active_backends()
            outside.wait()

    def unguarded():
        inside.wait()
        seen["unguarded"] = sdpa.scaled_dot_product_attention_with_lse(q, q, q).backend
        seen["unguarded_active"] = sdpa.backends.active_backends()
        outside.wait()

    run_threads(guarded, unguarded)
    assert seen["guarded"] == sdpa.SDPBackend.MATH
    assert seen["guarded_active"] == [sdpa.SDPBackend.MATH]
    assert seen["unguarded"] == sdpa.SDPBackend.FLASH_ATTENTION
    assert sdpa.SDPBackend.FLASH_ATTENTION in seen["unguarded_active"]


def test_concurrent_calls_from_two_threads(rng):
    q = rng.standard_normal((2, 4, 64, 32)).astype(np.float32)
    bias = B.compose(B.causal_lower_right(64, 64), B.AlibiBias(4))
    want = ref.forward(q, q, q, bias.materialize(q.shape[:3] + (64,), "float32"))[0]
    results = {0: [], 1: []}

    def worker(i):
        def run():
            for _ in range(20):
                results[i].append(sdpa.scaled_dot_product_attention(q, q, q, attn_mask=bias))
        return run

    run_threads(worker(0), worker(1))
    for outs in results.values():
        assert len(outs) == 20
        for out in outs:
            np.testing.assert_allclose(out, want, **ref.tolerance(np.float32))


def test_python_bias_materializes_from_concurrent_calls(rng):
    q = rng.standard_normal((1, 2, 16, 8))

    class Banded(B.AttnBias):
        def materialize(self, shape, dtype):
            i, j = np.arange(shape[2])[:, None], np.arange(shape[3])[None, :]
            return np.abs(i - j) <= 3

    bias = Banded()
    want = ref.forward(q, q, q, bias.materialize((1, 2, 16, 16), "float64"))[0]
    outs = []

    def worker():
        for _ in range(20):
            outs.append(sdpa.scaled_dot_product_attention(q, q, q, attn_mask=bias))

    run_threads(worker, worker)
    assert len(outs) == 40
    for out in outs:
        np.testing.assert_allclose(out, want, atol=1e-10)


def test_gil_is_released_during_compute(rng):
    # While another thread is inside one long attention call, this thread keeps running
    # Python. Were the GIL held for the call, this loop would stall for the whole call.
    q = rng.standard_normal((1, 16, 4096, 64)).astype(np.float32)
    looping, done = threading.Event(), threading.Event()
    duration = []

    def compute():
        looping.wait()
        time.sleep(0.05)  # the main thread is inside its loop by now
        t0 = time.perf_counter()
        sdpa.scaled_dot_product_attention(q, q, q)
        duration.append(time.perf_counter() - t0)
        done.set()

    worker = threading.Thread(target=compute)
    worker.start()
    looping.set()
    last = time.perf_counter()
    longest_stall = 0.0
    while not done.is_set():
        now = time.perf_counter()
        longest_stall = max(longest_stall, now - last)
        last = now
    worker.join()
    assert duration[0] > 0.05, "the call is too short to tell"
    assert longest_stall < 0.5 * duration[0], (longest_stall, duration[0])


def test_guard_cannot_be_closed_from_another_thread():
    default = sdpa.backends.active_backends()
    guard = sdpa._C._KernelGuard([sdpa.SDPBackend.MATH], False)
    guard.enter()
    errors = []

    def close_elsewhere():
        try:
            guard.exit()
        except RuntimeError as e:
            errors.append(str(e))
        assert sdpa.backends.active_backends() == default  # this thread was never guarded

    run_threads(close_elsewhere)
    assert errors and "thread that opened it" in errors[0]
    assert sdpa.backends.active_backends() == [sdpa.SDPBackend.MATH]
    guard.exit()
    assert sdpa.backends.active_backends() == default
