"""sdpa.flex tracing: every spelling of every operation (Python operators, torch functions
and Tensor methods, numpy ufuncs) traces to a program whose float64 evaluation equals
running the mod eagerly on concrete scalars; untraceable operations raise TypeError
naming the operation."""

import math
import os

import numpy as np
import pytest

import sdpa
from sdpa import flex
from sdpa.flex._trace import trace

# (score, b, h, q_idx, kv_idx) points: signs, zero, equal and unequal indices.
POINTS = [(s, b, h, q, kv) for s in (-1.75, 0.0, 0.3, 2.5) for b, h in ((0, 0), (1, 2))
          for q, kv in ((0, 0), (3, 1), (1, 3), (7, 7), (9, 2), (2, 9))]


def assert_traces_like_eager(mod, eager_args, is_mask=False):
    """The traced program's evaluation equals mod(*eager_args(point)) at every point."""
    program, _ = trace(mod, is_mask=is_mask)
    for point in POINTS:
        args = eager_args(*point)
        want = mod(*(args[1:] if is_mask else args))
        want = float(want.item() if hasattr(want, "item") else want)
        got = program.evaluate(*point)
        assert got == pytest.approx(want, rel=1e-13, abs=1e-13, nan_ok=True), (point, str(program))


def numpy_args(score, b, h, q, kv):
    return np.float64(score), np.int64(b), np.int64(h), np.int64(q), np.int64(kv)


# ---- numpy and Python operators: no torch -----------------------------------------------

SLOPES = np.array([0.5, 0.25, 0.125], np.float64)
TABLE = np.arange(3 * 21, dtype=np.float64).reshape(3, 21) / 7.0
DOC = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3], np.int64)

NUMPY_SCORE_MODS = {
    "arithmetic": lambda s, b, h, q, kv: (s * 2 - q / 3 + kv * 0.5) / (1 + h) - (-s),
    "int ops": lambda s, b, h, q, kv: s + (q - kv) // 3 + (q - kv) % 4 + (q * kv - 7) // -2,
    "pow": lambda s, b, h, q, kv: (s ** 2 + s ** 3 - (q + 1.0) ** -2 + (q - kv) ** 3
                                   + (kv + 1) ** 0.5 + 2 ** (s / 2)),
    "abs": lambda s, b, h, q, kv: abs(s) - abs(q - kv),
    "ufuncs": lambda s, b, h, q, kv: (np.tanh(s) + np.exp(s / 4) + np.log(q + 1.0)
                                      + np.sqrt(kv + 0.0) + np.exp2(-s) + np.log2(kv + 2.0)
                                      + np.square(s) + np.reciprocal(h + 1.0)),
    "minmax": lambda s, b, h, q, kv: np.maximum(s, q - kv) + np.minimum(s, 1) + np.fmax(s, -1.0),
    "where": lambda s, b, h, q, kv: np.where((q >= kv) & ~(h == 2), s, s - 3.0),
    "clip": lambda s, b, h, q, kv: s + np.clip(q - kv, -2, 3) + np.clip(s, a_min=0.0, a_max=None),
    "closure table": lambda s, b, h, q, kv: s + SLOPES[h] * (kv - q) + TABLE[h, q - kv + 10],
    "ndarray scalar on the left": lambda s, b, h, q, kv: np.float64(0.5) * s + np.array(2.0) * q,
    "rounding and trigonometry": lambda s, b, h, q, kv: (
        np.floor(s * 1.5) + np.ceil(q / 4) + np.sin(s) * np.cos(q * 0.25 - kv)
        + math.floor(s / 2) - math.ceil(s)),
    "bit ops": lambda s, b, h, q, kv: s + ((q ^ kv) & 6) + (q | 1) - (~kv) + (kv << 2)
                                      + (-q >> 1) + (1 << h) + np.left_shift(q, 65)
                                      + np.right_shift(-kv - 1, 64) + np.invert(q),
}


@pytest.mark.parametrize("name", sorted(NUMPY_SCORE_MODS))
def test_numpy_score_mods_trace_like_eager(name):
    assert_traces_like_eager(NUMPY_SCORE_MODS[name], numpy_args)


NUMPY_MASK_MODS = {
    "compare": lambda b, h, q, kv: (q >= kv) | (kv - q > 4),
    "xor": lambda b, h, q, kv: (q > kv) ^ (h == 2),
    "logical": lambda b, h, q, kv: np.logical_and(
        q >= kv, np.logical_not(np.logical_xor(b == 1, h == 2))),
    "document": lambda b, h, q, kv: DOC[q] == DOC[kv],
    "integer window": lambda b, h, q, kv: (q // 4 == kv // 4) & (q % 2 == kv % 2),
    "dilated": lambda b, h, q, kv: ((q - kv) & 3 == 0) | ((kv >> 2) == (q >> 2)),
}


@pytest.mark.parametrize("name", sorted(NUMPY_MASK_MODS))
def test_numpy_mask_mods_trace_like_eager(name):
    assert_traces_like_eager(NUMPY_MASK_MODS[name], numpy_args, is_mask=True)


def test_arrays_in_closures_and_globals_are_captured_by_name():
    bias = np.linspace(-1, 1, 19)

    def helper(q, kv):
        return bias[q - kv + 9]  # a closure of a function the mod calls

    def mod(score, b, h, q_idx, kv_idx):
        return score + helper(q_idx, kv_idx) + SLOPES[h]

    program, sources = trace(mod, is_mask=False)
    assert sorted(program.captured_names) == ["SLOPES", "bias"]
    assert sources["bias"] is bias and sources["SLOPES"] is SLOPES
    assert program.evaluate(1.0, 0, 2, 5, 3) == pytest.approx(1.0 + bias[11] + SLOPES[2])
    # The module keeps its array: only the traced copy of the mod holds the wrapper.
    assert type(globals()["SLOPES"]) is np.ndarray
    both = flex.and_masks(lambda b, h, q, kv: DOC[q] == DOC[kv], flex.causal_mask)
    assert trace(both, is_mask=True)[0].captured_names == ["DOC"]


def test_explicit_capture_of_an_attribute():
    class Holder:
        table = np.arange(10.0)

    holder = Holder()
    with pytest.raises(TypeError, match="sdpa.flex.capture"):
        trace(lambda s, b, h, q, kv: s + holder.table[q], is_mask=False)
    wrapped = flex.capture(holder.table, "table")
    assert len(wrapped) == 10 and wrapped.shape == (10,) and wrapped[3] == 3.0
    program, _ = trace(lambda s, b, h, q, kv: s + wrapped[q] * wrapped[9], is_mask=False)
    assert program.captured_names == ["table"]
    assert program.evaluate(0.5, 0, 0, 4, 0) == 0.5 + 4.0 * 9.0


def untraceable(mod, is_mask=False):
    with pytest.raises(TypeError) as info:
        trace(mod, is_mask=is_mask)
    assert isinstance(info.value, flex.TraceError)
    return str(info.value)


def test_untraceable_numpy_and_python_operations_name_the_operation():
    assert "cannot branch" in untraceable(lambda s, b, h, q, kv: s if q > kv else -s)
    assert "cannot branch" in untraceable(lambda s, b, h, q, kv: s + max(q, kv))
    assert "np.arctan" in untraceable(lambda s, b, h, q, kv: np.arctan(s))
    assert "np.where(condition)" in untraceable(lambda s, b, h, q, kv: s + np.where(q > kv))
    assert "math" in untraceable(lambda s, b, h, q, kv: math.exp(s))
    assert "Tensor.atan" in untraceable(lambda s, b, h, q, kv: s.atan())
    assert "float to an integer" in untraceable(lambda s, b, h, q, kv: s + s.long())
    assert "cannot index a Python list" in untraceable(lambda s, b, h, q, kv: s + [1.0, 2.0][q])
    assert "2 dimensions, indexed with 3" in untraceable(lambda s, b, h, q, kv: s + TABLE[h, q, kv])
    assert "index every dimension" in untraceable(lambda s, b, h, q, kv: s + TABLE[h] * 2)
    assert "slice" in untraceable(lambda s, b, h, q, kv: s + TABLE[h, 1:3])
    assert "cannot use a str" in untraceable(lambda s, b, h, q, kv: s + "x")
    with pytest.raises(TypeError, match="expected a callable score_mod"):
        trace(3, is_mask=False)


def test_type_errors_of_the_program_raise_sdpa_error():
    with pytest.raises(sdpa.Error, match="mask_mod must return bool"):
        trace(lambda b, h, q, kv: q - kv, is_mask=True)
    with pytest.raises(sdpa.Error, match="score_mod must return a number"):
        trace(lambda s, b, h, q, kv: q >= kv, is_mask=False)
    with pytest.raises(sdpa.Error, match="'\\^' expects int operands, got float and int"):
        trace(lambda s, b, h, q, kv: s + (s ^ q), is_mask=False)
    with pytest.raises(sdpa.Error, match="'<<' expects int operands"):
        trace(lambda s, b, h, q, kv: s + (q << s), is_mask=False)


# ---- torch: functions, methods and FlexAttention's own helpers --------------------------

torch_required = os.environ.get("SDPA_TESTS_REQUIRE_TORCH") == "1"


@pytest.fixture
def torch():
    torch = __import__("torch") if torch_required else pytest.importorskip("torch")
    # Eager int -> float promotion gives the default dtype: float64 keeps the eager side
    # as exact as the program's float64 evaluation.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield torch
    torch.set_default_dtype(default)


def torch_args(torch):
    # torch's FlexAttention hands mods float32 scores and int32 indices; float64 here keeps
    # the eager side exact to compare with the program's float64 evaluation.
    return lambda s, b, h, q, kv: (torch.tensor(s, dtype=torch.float64),
                                   *(torch.tensor(i, dtype=torch.int64) for i in (b, h, q, kv)))


def torch_score_mods(torch):
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)
    table = torch.arange(3 * 21, dtype=torch.float64).reshape(3, 21) / 7.0
    alpha = torch.tensor(0.75, dtype=torch.float64)
    return {
        "alibi": lambda s, b, h, q, kv: s + slopes[h] * (kv - q),
        "exp2 alibi": lambda s, b, h, q, kv: s + torch.exp2(-((h + 1) * 8.0 / 4)) * (kv - q),
        "nested index": lambda s, b, h, q, kv: s + table[h][q - kv + 10] + table[0, q],
        "functions": lambda s, b, h, q, kv: (torch.tanh(s) + torch.exp(s / 3) + torch.sigmoid(s)
                                             + torch.log(q + 1.0) + torch.sqrt(kv + 1.0)
                                             + torch.rsqrt(h + 1.0) + torch.log2(q + 2.0)
                                             + torch.square(s) + torch.abs(q - kv)),
        "methods": lambda s, b, h, q, kv: (s.tanh() + s.exp() + (q + 1).log() + s.abs()
                                           + s.clamp(-1, 1) + s.clamp_min(0.0) + s.sigmoid()
                                           + (kv - q).float() * 0.5 + s.pow(2)
                                           + s.maximum(q.to(torch.float64))),
        "where and clamp": lambda s, b, h, q, kv: torch.where(q >= kv, s, s - 3.0)
                                                  + torch.clamp(q - kv, min=-2, max=3)
                                                  + s.where(h == 0, -s),
        "min max pow": lambda s, b, h, q, kv: (torch.minimum(s, q * 0.5) + torch.max(s, kv - 2.0)
                                               + torch.min(q, kv) + torch.pow(2.0, s)
                                               + torch.pow(s, 3) + torch.relu(s - 1)),
        "div and add": lambda s, b, h, q, kv: (torch.div(q, 4, rounding_mode="floor")
                                               + torch.add(s, kv, alpha=2) + torch.sub(s, 1)
                                               + torch.div(kv, 3) + torch.remainder(q - kv, 3)
                                               + torch.true_divide(s, 2)),
        "0-d tensors": lambda s, b, h, q, kv: alpha * s + q * torch.tensor(3) + s / alpha,
        "rounding, trigonometry, bits": lambda s, b, h, q, kv: (
            torch.floor(s * 1.5) + s.ceil() + torch.sin(s) * (q * 0.5 - kv).cos()
            + torch.bitwise_left_shift(q, 2) + (kv >> 1) + torch.bitwise_and(q, 5)
            + q.bitwise_xor(kv) + (~q) + torch.bitwise_right_shift(-q, 70)),
        "dtype and constants": lambda s, b, h, q, kv: (
            torch.where(q > kv, s, torch.full_like(s, -1.5)) + torch.ones_like(s)
            + s.new_tensor(2.5) + torch.zeros_like(q) + (q > kv).to(s.dtype)
            + (q > kv).int() + (q - kv).bool().float() + s.type_as(q + 0.5)),
    }


def test_torch_score_mods_trace_like_eager(torch):
    for name, mod in torch_score_mods(torch).items():
        assert_traces_like_eager(mod, torch_args(torch)), name


def test_torch_mask_mods_and_helpers_trace_like_eager(torch):
    from torch.nn.attention import flex_attention as tf

    doc = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    mods = {
        "torch and_masks": tf.and_masks(causal, lambda b, h, q, kv: doc[q] == doc[kv]),
        "torch or_masks": tf.or_masks(causal, lambda b, h, q, kv: kv <= 2),
        "torch noop_mask": tf.noop_mask,
        "logical": lambda b, h, q, kv: torch.logical_and(q >= kv, torch.logical_not(
            torch.logical_xor(b == 1, h == 2))) | torch.eq(kv, 0),
        "tensor on the left": lambda b, h, q, kv: (torch.tensor(3) <= q) & (doc[kv] != doc[q]),
        "bitwise on bools": lambda b, h, q, kv: (torch.bitwise_or(q > kv, ~(kv > 5))
                                                 & torch.ne(h, 1)),
    }
    for name, mod in mods.items():
        assert_traces_like_eager(mod, torch_args(torch), is_mask=True), name


def test_untraceable_torch_operations_name_the_operation(torch):
    assert "torch.atan" in untraceable(lambda s, b, h, q, kv: torch.atan(s))
    assert "Tensor.atan" in untraceable(lambda s, b, h, q, kv: s.atan())
    assert "torch.nn.functional.gelu" in untraceable(
        lambda s, b, h, q, kv: torch.nn.functional.gelu(s))
    assert "reduction" in untraceable(lambda s, b, h, q, kv: torch.max(s))
    assert "rounding_mode='trunc'" in untraceable(
        lambda s, b, h, q, kv: s + torch.div(q, 2, rounding_mode="trunc"))
    table = torch.zeros(4, 4)
    assert "cannot use a Tensor" in untraceable(lambda s, b, h, q, kv: s + table)
    assert "scalars" in untraceable(lambda b, h, q, kv: q.new_ones((2, 2)) > 0, is_mask=True)
    assert not hasattr(flex.causal_mask, "atan")  # hasattr probes stay AttributeErrors
