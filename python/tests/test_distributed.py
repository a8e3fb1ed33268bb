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


@pytest.mark.parametrize("world", [2, 4])
def test_ring_and_all_gather_equal_the_whole_sequence(world):
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(r), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            p.kill()
    for r, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{text}"
        assert "cases ok" in text


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
