"""atheris target for sdpa's Python entry points on numpy arrays.

Odd shapes (0, 1, broadcast, huge through zero strides), every numpy dtype, non-contiguous
and negative strides, masks of numpy's kinds, and argument values of the wrong type go to
scaled_dot_product_attention (with lse and backward), explain, flex_attention and
create_block_mask. A call must return or raise one of the errors a caller can handle
(sdpa.Error, TypeError, ValueError, OverflowError); a valid call on moderate finite
inputs must give FLASH == MATH within float32 tolerance. Anything else is a finding.

Run: SDPA_FUZZ_PYTHON=venv/bin/python scripts/fuzz.sh 60 python
"""

import sys

import atheris
# numpy is not instrumented: its coverage is not what is being fuzzed, and atheris's
# instrumentation of it leaked about 2 KB per input on some inputs (the RSS of an hour's
# run would pass the 4 GB limit).
import numpy as np

with atheris.instrument_imports():
    import sdpa

HANDLED = (sdpa.Error, TypeError, ValueError, OverflowError)
DTYPES = [np.float32, np.float32, np.float64, np.float16, np.int32, np.bool_, np.complex64]
LENGTHS = [0, 1, 2, 7, 17, 64, 65]


def array(fdp, shape, dtype, rng):
    """An array of `shape`: contiguous, transposed, reversed, strided or a broadcast."""
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 4 or any(s > 4096 for s in shape):
        return np.lib.stride_tricks.as_strided(np.ones(1, dtype), shape, (0,) * len(shape))
    if kind == 1 and len(shape) == 4:
        return rng.standard_normal((shape[0], shape[2], shape[1], shape[3])).astype(
            dtype).transpose(0, 2, 1, 3)
    if kind == 2:
        return rng.standard_normal(shape).astype(dtype)[..., ::-1]
    if kind == 3 and len(shape) >= 1:
        wide = tuple(shape[:-1]) + (2 * shape[-1],)
        return rng.standard_normal(wide).astype(dtype)[..., ::2]
    return rng.standard_normal(shape).astype(dtype)


def odd_value(fdp):
    return fdp.PickValueInList([None, 0.0, -1.0, 0.5, float("nan"), float("inf"), "0.1",
                                 2 ** 70, -(2 ** 70), (1, 2), object()])


def check_close(name, a, b, tol):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"{name}: FLASH shape {a.shape} != MATH shape {b.shape}")
    both = np.isfinite(a) & np.isfinite(b)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        raise AssertionError(f"{name}: FLASH and MATH disagree on NaN positions")
    if both.any() and np.abs(a[both] - b[both]).max() > tol:
        raise AssertionError(f"{name}: FLASH - MATH = {np.abs(a[both] - b[both]).max()}")


def one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    rng = np.random.default_rng(fdp.ConsumeIntInRange(0, 2 ** 32 - 1))
    dtype = fdp.PickValueInList(DTYPES)
    rank = fdp.PickValueInList([4, 4, 3, 2, 5])
    B, Hkv = fdp.ConsumeIntInRange(0, 2), fdp.ConsumeIntInRange(1, 3)
    Hq = Hkv * fdp.ConsumeIntInRange(1, 3)
    L, S = fdp.PickValueInList(LENGTHS), fdp.PickValueInList(LENGTHS)
    if fdp.ConsumeIntInRange(0, 15) == 0:
        S = 2 ** fdp.ConsumeIntInRange(20, 40)  # numpy caps size * itemsize at 2^63
    E = fdp.ConsumeIntInRange(0, 70)
    lead = (B, Hq)[4 - rank:] if rank <= 4 else (1, B, Hq)
    q = array(fdp, lead + (L, E), dtype, rng)
    lead_kv = (B, Hkv)[4 - rank:] if rank <= 4 else (1, B, Hkv)
    k = array(fdp, lead_kv + (S, E), dtype, rng)
    v = array(fdp, lead_kv + (S, E), dtype, rng)
    kwargs = {"enable_gqa": fdp.ConsumeBool(), "is_causal": fdp.ConsumeIntInRange(0, 3) == 0}
    mask_kind = fdp.ConsumeIntInRange(0, 3)
    if mask_kind == 1 and L * S <= 1 << 16:
        kwargs["attn_mask"] = rng.random((L, S)) < fdp.ConsumeProbability()
    elif mask_kind == 2 and L * S <= 1 << 16:
        kwargs["attn_mask"] = rng.standard_normal((1, L, S)).astype(dtype)
    elif mask_kind == 3:
        kwargs[fdp.PickValueInList(["scale", "dropout_p", "generator", "attn_mask"])] = \
            odd_value(fdp)
    operation = fdp.ConsumeIntInRange(0, 3)
    # Outputs (grad_k/grad_v: S rows even when L = 0) count as work too.
    work = max(B, 1) * Hq * max(L, 1) * min(S, 1 << 40) * max(E, 1)
    try:
        if operation == 0 or work > 1 << 22:
            sdpa.explain(q, k, v, **kwargs)
        elif operation == 1:
            results = []
            for backend in ("FLASH_ATTENTION", "MATH"):
                with sdpa.sdpa_kernel(backend):
                    r = sdpa.scaled_dot_product_attention_with_lse(q, k, v, **kwargs)
                    go = np.ones_like(r.out)
                    g = sdpa.scaled_dot_product_attention_backward(
                        go, q, k, v, r.out, r.lse, **kwargs)
                results.append((r, g))
            # Compared where float32 resolves the scores: at |scale * q.k| ~ 1e7 and beyond
            # FLASH's backward (P from the float32 lse) legitimately departs from MATH.
            moderate = isinstance(kwargs.get("scale", 1.0), float) and \
                abs(kwargs.get("scale", 1.0)) <= 2.0
            if dtype == np.float32 and not kwargs.get("dropout_p") and moderate:
                (rf, gf), (rm, gm) = results
                check_close("out", rf.out, rm.out, 1e-3)
                check_close("grad_v", gf.grad_v, gm.grad_v, 1e-3 * max(1, L))
        elif operation == 2:
            sdpa.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: s * 0.5 + (i - j),
                                enable_gqa=kwargs["enable_gqa"])
        else:
            bm = sdpa.create_block_mask(lambda b, h, i, j: i >= j, None, None, L, S,
                                        BLOCK_SIZE=fdp.PickValueInList([1, 7, 128, 0, -1]))
            sdpa.flex_attention(q, k, v, block_mask=bm)
    except HANDLED:
        pass


def main():
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
