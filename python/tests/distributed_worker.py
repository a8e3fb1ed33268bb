"""One rank of test_distributed.py: joins a gloo group on 127.0.0.1, runs every case of
context_parallel_attention on its slice and checks out and the gradients of q, k and v
against a float64 reference of attention over the whole sequence, computed here with
plain torch operations (with dropout: one process's float64 sdpa call with the same
dropout state, whose mask the ranks must reproduce). Exits 0 when every case agrees;
prints the failing case.

    python distributed_worker.py RANK WORLD_SIZE PORT [die]

With `die`, rank 1 exits in the middle of a ring call (after its first attention) and
every other rank must raise sdpa.Error within the call's timeout instead of hanging.
"""

from __future__ import annotations

import math
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import sdpa
import sdpa.distributed as cp

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float64: 1e-12}


def visible(n, is_causal, window, docs):
    """[n, n] bool: query i sees key j (causal, window (left, right), document lengths)."""
    i = torch.arange(n).unsqueeze(1)
    j = torch.arange(n).unsqueeze(0)
    keep = torch.ones(n, n, dtype=torch.bool)
    if is_causal:
        keep &= j <= i
    if window is not None:
        keep &= (j >= i - window[0]) & (j <= i + window[1])
    if docs is not None:
        doc = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))
        keep &= doc.unsqueeze(1) == doc.unsqueeze(0)
    return keep


def reference(q, k, v, dout, keep, scale):
    """float64 attention over the whole sequence and its gradients (GQA by repetition)."""
    q, k, v, dout = (t.double().detach().requires_grad_(t is not dout) for t in (q, k, v, dout))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ kk.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(~keep, -math.inf)
    out = torch.softmax(s, -1) @ vv
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def dropout_reference(q, k, v, dout, mask, is_causal, scale, dropout_p, state):
    """float64 sdpa over the whole sequence with dropout state `state` (one process), and
    its gradients: the mask context parallelism must reproduce."""
    q, k, v, dout = (t.double() for t in (q, k, v, dout))
    kw = dict(attn_mask=mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
              enable_gqa=q.shape[1] != k.shape[1])
    whole = sdpa.scaled_dot_product_attention_with_lse(q, k, v, dropout_state=state, **kw)
    g = sdpa.scaled_dot_product_attention_backward(dout, q, k, v, whole.out, whole.lse,
                                                   dropout_state=state, **kw)
    return whole.out, g.grad_q, g.grad_k, g.grad_v


def run_case(rank, world, name, *, total, heads=(4, 2), dims=(16, 12), dtype=torch.float32,
             is_causal=False, layout="contiguous", strategy="ring", uneven=None, scale=None,
             window=None, docs=None, dropout_p=0.0, dropout_state=None):
    torch.manual_seed(1234)  # every rank draws the same global tensors
    b, (hq, hkv), (e, ev) = 2, heads, dims
    q = torch.randn(b, hq, total, e)
    k = torch.randn(b, hkv, total, e)
    v = torch.randn(b, hkv, total, ev)
    dout = torch.randn(b, hq, total, ev)
    causal_arg, causal = is_causal and docs is None, is_causal
    parts = []
    if window is not None:
        parts.append(sdpa.attention.bias.LocalAttentionBias(*window))
    if docs is not None:
        parts.append(sdpa.attention.bias.BlockDiagonalBias.from_seqlens(docs, causal=is_causal))
        is_causal = False
    mask = None
    if parts:
        mask = parts[0] if len(parts) == 1 else sdpa.attention.bias.compose(parts)
    if dropout_p > 0:
        # Without a state, rank 0 draws sdpa's default generator's next (seed, offset).
        state = dropout_state
        if state is None:
            sdpa.manual_seed(4321)
            state = (4321, 0)
        gold = dropout_reference(q, k, v, dout, mask, causal_arg, scale, dropout_p, state)
    else:
        gold = reference(q, k, v, dout, visible(total, causal, window, docs), scale)

    def local(x):
        if uneven is not None:
            return torch.split(x, uneven, dim=-2)[rank]
        return cp.shard(x, layout, world, rank)

    ql, kl, vl = (local(t).to(dtype).requires_grad_() for t in (q, k, v))
    out = cp.context_parallel_attention(ql, kl, vl, strategy=strategy, layout=layout,
                                        is_causal=is_causal, attn_mask=mask, scale=scale,
                                        enable_gqa=hq != hkv, dropout_p=dropout_p,
                                        dropout_state=dropout_state)
    out.backward(local(dout).to(dtype))
    tol = TOLERANCE[dtype]
    for what, got, want in (("out", out, gold[0]), ("grad_q", ql.grad, gold[1]),
                            ("grad_k", kl.grad, gold[2]), ("grad_v", vl.grad, gold[3])):
        want = local(want)
        if got.shape != want.shape:
            raise AssertionError(f"{name}: {what} shape {tuple(got.shape)}, "
                                 f"want {tuple(want.shape)}")
        if want.numel() == 0:
            continue
        err = (got.double() - want).abs().max().item() / max(want.abs().max().item(), 1.0)
        if not err <= tol:
            raise AssertionError(f"{name}: rank {rank}: {what} relative error {err:.3e} "
                                 f"> {tol:.0e}")
    return out.detach(), ql.grad, kl.grad, vl.grad


def expect_error(fn, needle):
    try:
        fn()
    except sdpa.Error as e:
        if needle not in str(e):
            raise AssertionError(f"error {e!r} does not name {needle!r}") from e
        return
    raise AssertionError(f"no sdpa.Error naming {needle!r}")


def die_mid_call(rank, world):
    import sdpa.distributed.ring as ring

    if rank == 1:
        def attend_then_die(*args, **kwargs):
            os._exit(3)

        ring._Ring.attend = attend_then_die
    q, k, v = (torch.randn(1, 2, 40, 8, requires_grad=True) for _ in range(3))
    start = time.monotonic()
    try:
        cp.context_parallel_attention(q, k, v, is_causal=True, timeout=20).sum().backward()
    except sdpa.Error as e:
        assert "failed" in str(e) and "rank" in str(e), str(e)
        print(f"rank {rank}: peer death reported after {time.monotonic() - start:.1f} s: {e}")
        os._exit(0)
    raise AssertionError(f"rank {rank}: no error although rank 1 died")


def main():
    rank, world, port = (int(a) for a in sys.argv[1:4])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)
    if sys.argv[4:] == ["die"]:
        return die_mid_call(rank, world)
    uneven = [7, 30] if world == 2 else [5, 0, 20, 12]
    cases = [
        dict(name="plain ring", total=8 * world + 3),
        dict(name="causal zigzag ring", total=12 * world + 5, is_causal=True, layout="zigzag"),
        dict(name="causal uneven ring", total=sum(uneven), is_causal=True, uneven=uneven),
        dict(name="plain uneven ring, MHA, scale", total=sum(uneven), uneven=uneven,
             heads=(3, 3), scale=0.3),
        dict(name="causal zigzag ring bf16", total=16 * world, is_causal=True, layout="zigzag",
             dtype=torch.bfloat16),
        dict(name="causal zigzag all_gather", total=12 * world + 5, is_causal=True,
             layout="zigzag", strategy="all_gather"),
        dict(name="causal uneven all_gather float64", total=sum(uneven), is_causal=True,
             uneven=uneven, strategy="all_gather", dtype=torch.float64),
        # Windows and documents that cross rank boundaries.
        dict(name="window zigzag ring", total=12 * world + 5, window=(6, 0), layout="zigzag"),
        dict(name="two-sided window uneven ring", total=sum(uneven), window=(4, 3),
             uneven=uneven),
        dict(name="causal documents ring", total=10 * world + 3, is_causal=True,
             docs=[3, 10 * world - 5, 5]),
        dict(name="documents and window zigzag ring", total=12 * world, window=(5, 0),
             docs=[7, 12 * world - 7], layout="zigzag"),
        dict(name="causal documents all_gather", total=10 * world + 3, is_causal=True,
             docs=[3, 10 * world - 5, 5], strategy="all_gather", layout="zigzag"),
        # Dropout equal to one process's with the same (seed, offset).
        dict(name="causal zigzag ring dropout", total=12 * world + 5, is_causal=True,
             layout="zigzag", dropout_p=0.3, dropout_state=(2**63 + 5, 9)),
        dict(name="plain uneven ring dropout, default generator", total=sum(uneven),
             uneven=uneven, dropout_p=0.5),
        dict(name="documents and window zigzag ring dropout", total=12 * world,
             window=(5, 0), docs=[7, 12 * world - 7], layout="zigzag", dropout_p=0.2,
             dropout_state=(11, 3)),
        dict(name="causal uneven all_gather float64 dropout", total=sum(uneven),
             is_causal=True, uneven=uneven, strategy="all_gather", dtype=torch.float64,
             dropout_p=0.4, dropout_state=(12, 0)),
    ]
    for case in cases:
        run_case(rank, world, **case)
    # Run to run, a fixed rank count gives the same bits (fixed merge and sum order).
    runs = [run_case(rank, world, name="determinism", total=12 * world + 5, is_causal=True,
                     layout="zigzag") for _ in range(2)]
    for a, b in zip(*runs):
        if not torch.equal(a, b):
            raise AssertionError(f"rank {rank}: two identical ring calls differ")
    x = torch.randn(1, 2, 4, 8)
    expect_error(lambda: cp.context_parallel_attention(x, x, x, dropout_p=1.5), "dropout_p")
    expect_error(lambda: cp.context_parallel_attention(x, x, x, attn_mask=torch.ones(4, 4)),
                 "attn_mask")
    expect_error(lambda: cp.context_parallel_attention(
        x, x, x, attn_mask=sdpa.attention.bias.LocalAttentionBias(2, 0), is_causal=True),
        "not both")
    expect_error(lambda: cp.context_parallel_attention(x.double(), x.double(), x.double()),
                 "all_gather")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {len(cases)} cases ok")


if __name__ == "__main__":
    main()
