"""float32 accuracy of long rows against PyTorch's own: the error of sdpa's FLASH float32
output against a float64 result is at most twice the error of torch's float32 CPU SDPA on
the same inputs (max |out - golden| / max |golden|, golden = torch in float64).

The patterns are those where float32 rounding compounds over the keys: transformers'
StaticCache (300 filled slots of a long cache, the rest masked), unmasked rows of 65536
keys (prefill and a GQA decode step), and every mask kind at 8192 keys.
"""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import sdpa  # noqa: E402
from sdpa.attention import bias as B  # noqa: E402

E = 64


def relative_error(out, golden):
    return ((out.double() - golden).abs().max() / golden.abs().max()).item()


def check(hq, hkv, L, S, mask=None, seed=0):
    """mask: None, a bool tensor or a float tensor broadcastable to [1, hq, L, S]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, L, E, generator=gen)
    k = torch.randn(1, hkv, S, E, generator=gen)
    v = torch.randn(1, hkv, S, E, generator=gen)
    gqa = hq != hkv
    golden_mask = mask.double() if mask is not None and mask.is_floating_point() else mask
    golden = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                            attn_mask=golden_mask, enable_gqa=gqa)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
        ours = sdpa.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    err_ours, err_theirs = relative_error(ours, golden), relative_error(theirs, golden)
    assert err_ours <= 2.0 * err_theirs, (err_ours, err_theirs)


def test_static_cache_pattern_at_65536_keys():
    L, S = 64, 65536
    keep = torch.zeros(1, 1, L, S, dtype=torch.bool)
    keep[..., :300] = True
    check(2, 2, L, S, keep)


@pytest.mark.parametrize("hq, hkv, L", [(2, 2, 64), (4, 2, 1)], ids=["prefill", "decode"])
def test_unmasked_rows_of_65536_keys(hq, hkv, L):
    check(hq, hkv, L, 65536)


@pytest.mark.parametrize("kind", ["causal", "window", "alibi", "documents", "padding",
                                  "float"])
def test_every_mask_kind_at_8192_keys(kind):
    H, L, S = 2, 96, 8192
    if kind == "float":
        gen = torch.Generator().manual_seed(5)
        mask = 0.5 * torch.randn(1, 1, L, S, generator=gen)
    else:
        bias = {
            "causal": lambda: B.causal_lower_right(L, S),
            "window": lambda: B.LocalAttentionBias(2000, 0),
            "alibi": lambda: B.AlibiBias(H),
            "documents": lambda: B.BlockDiagonalBias([0, 40, L], [0, 3000, S]),
            "padding": lambda: B.PaddedKeysBias([5000]),
        }[kind]()
        # torch gets the same mask dense; sdpa runs it natively from the dense values too
        # (the bias' own fused path is covered by tests/cpu/accuracy_test.cpp).
        mask = torch.from_numpy(bias.materialize((1, H, L, S), "float32"))
    check(H, H, L, S, mask)
