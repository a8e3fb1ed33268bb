"""sdpa.backends.SDPAParams and can_use_*_attention: torch.backends.cuda's per-call
checks, answered by sdpa's backend checks (issue 28 item 9)."""

import warnings

import numpy as np
import pytest

import sdpa
from sdpa.backends import (SDPAParams, can_use_cudnn_attention, can_use_efficient_attention,
                           can_use_flash_attention)

CHECKS = {
    sdpa.SDPBackend.FLASH_ATTENTION: can_use_flash_attention,
    sdpa.SDPBackend.EFFICIENT_ATTENTION: can_use_efficient_attention,
    sdpa.SDPBackend.CUDNN_ATTENTION: can_use_cudnn_attention,
}


def _qkv(L=65, S=70, E=33, Ev=None, Hq=3, Hkv=3, dtype=np.float32):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, Hq, L, E)).astype(dtype)
    k = rng.standard_normal((2, Hkv, S, E)).astype(dtype)
    v = rng.standard_normal((2, Hkv, S, Ev or E)).astype(dtype)
    return q, k, v


def _recorded(check, params, debug):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = check(params, debug)
    return result, [str(w.message) for w in caught if w.category is UserWarning]


CASES = {
    "plain": (_qkv(), {}),
    "gqa": (_qkv(Hq=6, Hkv=2), {"enable_gqa": True}),
    "causal_dropout": (_qkv(), {"is_causal": True, "dropout": 0.3}),
    "bool_mask": (_qkv(L=7, S=9), {"attn_mask": np.tril(np.ones((7, 9), dtype=bool))}),
    "head_dim_0": (_qkv(E=0, Ev=0), {}),
    "float64": (_qkv(dtype=np.float64), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("backend", sorted(CHECKS, key=lambda b: b.name))
def test_answers_match_explain(case, backend):
    (q, k, v), extra = CASES[case]
    params = SDPAParams(q, k, v, extra.get("attn_mask"), extra.get("dropout", 0.0),
                        extra.get("is_causal", False), extra.get("enable_gqa", False))
    verdict = next(x for x in sdpa.explain(q, k, v, extra.get("attn_mask"),
                                           extra.get("dropout", 0.0),
                                           extra.get("is_causal", False),
                                           enable_gqa=extra.get("enable_gqa", False)).verdicts
                   if x.backend == backend)
    quiet, quiet_warnings = _recorded(CHECKS[backend], params, False)
    loud, reasons = _recorded(CHECKS[backend], params, True)
    assert quiet == loud == verdict.supported
    assert quiet_warnings == []
    # debug: one warning per reason, each naming the backend; none when it can run.
    expected = [] if loud else [f"{backend.name}: {r}" for r in verdict.reasons]
    assert reasons == expected
    assert loud or reasons


def test_flash_runs_float32_and_refuses_head_dim_0_with_a_reason():
    assert can_use_flash_attention(SDPAParams(*_qkv(), None, 0.0, False, False))
    ok, reasons = _recorded(can_use_flash_attention,
                            SDPAParams(*_qkv(E=0, Ev=0), None, 0.0, False, False), True)
    assert not ok
    assert any("head_dim" in r for r in reasons), reasons


def test_cudnn_refuses_host_arrays():
    ok, reasons = _recorded(can_use_cudnn_attention, SDPAParams(*_qkv()), True)
    assert not ok
    assert reasons and all(r.startswith("CUDNN_ATTENTION: ") for r in reasons)


def test_guards_and_switches_do_not_change_the_answer():
    params = SDPAParams(*_qkv())
    with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
        assert can_use_flash_attention(params)
    sdpa.backends.enable_flash_sdp(False)
    try:
        assert can_use_flash_attention(params)
    finally:
        sdpa.backends.enable_flash_sdp(True)


def test_invalid_input_raises():
    q, k, _ = _qkv()
    _, _, v = _qkv(S=71)
    with pytest.raises(sdpa.Error, match="value"):
        can_use_flash_attention(SDPAParams(q, k, v))


def test_torch_params_are_accepted():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(a) for a in _qkv(Hq=6, Hkv=2))
    theirs = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, True)
    ours = SDPAParams(q, k, v, None, 0.0, True, True)
    for check in CHECKS.values():
        assert check(theirs) == check(ours)
    assert can_use_flash_attention(theirs)
