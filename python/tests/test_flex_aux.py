"""flex_attention's return_aux (torch 2.15's AuxRequest / AuxOutput): lse and max_scores
against a float64 reference computed here, on numpy and torch inputs (issue 28 item 7)."""

import numpy as np
import pytest

import sdpa
from sdpa.flex import AuxOutput, AuxRequest, causal_mask, create_block_mask, flex_attention

B, HQ, HKV, L, S, E = 2, 4, 2, 37, 70, 24
CAP = 4.0


def _inputs(dtype=np.float32):
    rng = np.random.default_rng(11)
    q = (2 * rng.standard_normal((B, HQ, L, E))).astype(dtype)
    k = (2 * rng.standard_normal((B, HKV, S, E))).astype(dtype)
    v = rng.standard_normal((B, HKV, S, 9)).astype(dtype)
    return q, k, v


def _reference(q, k):
    """max_scores and lse in float64: soft-capped scores, causal (top-left)."""
    k = np.repeat(np.asarray(k, np.float64), HQ // HKV, axis=1)
    s = np.asarray(q, np.float64) @ k.swapaxes(-1, -2) / np.sqrt(E)
    s = CAP * np.tanh(s / CAP)
    s = np.where(np.tril(np.ones((L, S), dtype=bool)), s, -np.inf)
    m = s.max(axis=-1)
    return m, m + np.log(np.exp(s - m[..., None]).sum(axis=-1))


def _call(q, k, v, **kwargs):
    blocks = create_block_mask(causal_mask, None, None, L, S, BLOCK_SIZE=16)
    return flex_attention(q, k, v, sdpa.flex.soft_cap(CAP), blocks, enable_gqa=True, **kwargs)


def test_numpy_max_scores_and_lse_match_float64():
    q, k, v = _inputs()
    out, aux = _call(q, k, v, return_aux=AuxRequest(lse=True, max_scores=True))
    assert isinstance(aux, AuxOutput)
    m_ref, lse_ref = _reference(q, k)
    assert aux.max_scores.dtype == np.float32 and aux.max_scores.shape == (B, HQ, L)
    np.testing.assert_allclose(aux.max_scores, m_ref, rtol=5e-6, atol=5e-6)
    np.testing.assert_allclose(aux.lse, lse_ref, rtol=5e-6, atol=5e-6)
    np.testing.assert_array_equal(out, _call(q, k, v))


def test_only_what_is_requested_comes_back():
    q, k, v = _inputs()
    _, aux = _call(q, k, v, return_aux=AuxRequest(max_scores=True))
    assert aux.lse is None and aux.max_scores is not None
    _, aux = _call(q, k, v, return_aux=AuxRequest())
    assert aux == AuxOutput(None, None)
    # return_lse still counts beside return_aux, as in torch.
    _, aux = _call(q, k, v, return_lse=True, return_aux=AuxRequest())
    assert aux.lse is not None and aux.max_scores is None


def test_float64_inputs_score_in_float64():
    q, k, v = _inputs(np.float64)
    _, aux = _call(q, k, v, return_aux=AuxRequest(max_scores=True))
    m_ref, _ = _reference(q, k)
    # One float32 rounding of the result, not float32 arithmetic.
    np.testing.assert_allclose(aux.max_scores, m_ref, rtol=1.2e-7, atol=1e-12)


def test_torch_aux_request_with_autograd():
    torch = pytest.importorskip("torch")
    from torch.nn.attention import flex_attention as tf

    q, k, v = (torch.from_numpy(a).requires_grad_() for a in _inputs())
    out, aux = _call(q, k, v, return_aux=tf.AuxRequest(lse=True, max_scores=True))
    m_ref, lse_ref = _reference(q.detach().numpy(), k.detach().numpy())
    assert isinstance(aux.max_scores, torch.Tensor) and not aux.max_scores.requires_grad
    np.testing.assert_allclose(aux.max_scores.numpy(), m_ref, rtol=5e-6, atol=5e-6)
    np.testing.assert_allclose(aux.lse.detach().numpy(), lse_ref, rtol=5e-6, atol=5e-6)
    # torch's own lse for the same call (its CPU path has no max_scores).
    blocks = tf.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, L, S,
                                  device="cpu", BLOCK_SIZE=16)
    _, theirs = tf.flex_attention(q.detach(), k.detach(), v.detach(),
                                  lambda s, b, h, qi, ki: CAP * torch.tanh(s / CAP), blocks,
                                  enable_gqa=True, return_aux=tf.AuxRequest(lse=True))
    np.testing.assert_allclose(aux.lse.detach().numpy(), theirs.lse.numpy(), rtol=1e-5,
                               atol=1e-5)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
