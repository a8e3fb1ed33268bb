"""sdpa.distributed: context-parallel attention on real processes (gloo over 127.0.0.1),
2 and 4 ranks, each running distributed_worker.py's cases against a float64 reference of
the whole sequence; and the layouts' shard / unshard / segments without processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import sdpa.distributed as cp  # noqa: E402

WORKER = Path(__file__).with_name("distributed_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world, *extra, timeout=300):
    """Runs distributed_worker.py on `world` ranks; returns [(returncode, output)]."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port),
                               *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, text) for p, text in zip(procs, outputs)]


@pytest.mark.parametrize("world", [2, 4])
def test_ring_and_all_gather_equal_the_whole_sequence(world):
    for r, (code, text) in enumerate(run_ranks(world)):
        assert code == 0, f"rank {r} failed:\n{text}"
        assert "cases ok" in text


def test_a_rank_dying_mid_call_makes_the_others_raise():
    # Rank 1 exits after its first attention; ranks 0 and 2 must raise sdpa.Error (20 s
    # timeout per wait) rather than hang: the whole run is bounded at 120 s.
    results = run_ranks(3, "die", timeout=120)
    assert results[1][0] == 3, results[1][1]
    for r in (0, 2):
        code, text = results[r]
        assert code == 0 and "peer death reported" in text, f"rank {r}:\n{text}"


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world,total", [(2, 9), (3, 17), (4, 8), (4, 3)])
def test_shard_unshard_and_segments(layout, world, total):
    x = torch.arange(total).reshape(1, 1, total, 1)
    slices = [cp.shard(x, layout, world, r) for r in range(world)]
    assert torch.equal(cp.unshard(slices, layout), x)
    lengths = [s.shape[-2] for s in slices]
    for r, s in enumerate(slices):
        positions = []
        for seg in cp.segments(layout, lengths, r):
            positions.extend(range(seg.start, seg.start + seg.length))
            local = s[0, 0, seg.local:seg.local + seg.length, 0].tolist()
            assert local == list(range(seg.start, seg.start + seg.length))
        assert positions == s[0, 0, :, 0].tolist()


def test_zigzag_balances_causal_work():
    # Causal work of a rank: sum over its positions of (position + 1) keys.
    world, total = 4, 64
    x = torch.arange(total).reshape(1, 1, total, 1)
    work = {layout: [int((cp.shard(x, layout, world, r) + 1).sum()) for r in range(world)]
            for layout in ("contiguous", "zigzag")}
    assert max(work["zigzag"]) == min(work["zigzag"])
    assert max(work["contiguous"]) > 6 * min(work["contiguous"])


def test_layout_errors_name_what_was_expected():
    with pytest.raises(ValueError, match="zigzag split"):
        cp.segments("zigzag", [4, 2], 0)
    with pytest.raises(ValueError, match="layout"):
        cp.segments("striped", [3, 3], 0)
    with pytest.raises(ValueError, match="strategy"):
        cp.context_parallel_attention(None, None, None, strategy="tree")


def _band_keeps(mask, i, j):
    """What a top-left LocalAttentionBias (or None) keeps at local (i, j)."""
    if mask is None:
        return True
    return ((mask.left is None or j >= i - mask.left) and
            (mask.right is None or j <= i + mask.right))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("band,docs", [((None, 0), None), ((4, 0), None), ((3, 2), None),
                                       ((None, None), (5, 20, 12)), ((None, 0), (5, 20, 12)),
                                       ((6, 1), (9, 28)), ((0, 0), None), ((None, 3), None)])
def test_pieces_cover_exactly_the_visible_pairs(layout, band, docs):
    from sdpa.distributed.pieces import GlobalMask, pieces
    world, total = 3, 37
    x = torch.arange(total).reshape(1, 1, total, 1)
    lengths = [cp.shard(x, layout, world, r).shape[-2] for r in range(world)]
    cu = None
    if docs is not None:
        cu = (0,) + tuple(int(c) for c in torch.tensor(docs).cumsum(0))
    mask = GlobalMask(band[0], band[1], cu)

    def sees(i, j):
        ok = (band[0] is None or j >= i - band[0]) and (band[1] is None or j <= i + band[1])
        if cu is not None:
            ok = ok and max(d for d in range(len(cu) - 1) if cu[d] <= i) == max(
                d for d in range(len(cu) - 1) if cu[d] <= j)
        return ok

    for r in range(world):
        q_segs = cp.segments(layout, lengths, r)
        q_pos = cp.shard(x, layout, world, r)[0, 0, :, 0].tolist()
        for owner in range(world):
            kv_pos = cp.shard(x, layout, world, owner)[0, 0, :, 0].tolist()
            covered = {}
            for q0, q1, k0, k1, m, gq0, gk0 in pieces(q_segs, cp.segments(layout, lengths, owner),
                                                      mask):
                # The global positions of the first row and key (for dropout's draws).
                assert (q_pos[q0], kv_pos[k0]) == (gq0, gk0)
                for a in range(q0, q1):
                    assert any(_band_keeps(m, a - q0, b - k0) for b in range(k0, k1)), \
                        "a piece row without keys"
                    for b in range(k0, k1):
                        if _band_keeps(m, a - q0, b - k0):
                            assert (a, b) not in covered, "pieces overlap"
                            covered[(a, b)] = True
            want = {(a, b) for a in range(len(q_pos)) for b in range(len(kv_pos))
                    if sees(q_pos[a], kv_pos[b])}
            assert set(covered) == want
