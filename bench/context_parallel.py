#!/usr/bin/env python3
"""Context parallelism on this machine: the ring over N gloo ranks of one thread each
against one process running the whole sequence on N threads (issue 26's overhead, target
ring / single <= 1.15), and the bytes each rank sent against the ring's formula.

    python bench/context_parallel.py [--ranks 2] [--seq-lens 16384,32768] [--repeats 3]
                                     [--json out.json]

Causal attention over the zigzag layout (every rank the same work), B=1, Hq=Hkv=4,
E=64, float32; the forward at every length and forward + backward at the first. Each
rank process builds the same global tensors and times its calls between barriers, a
call's time being the slowest rank's. The single process runs first, then the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

import torch

HEADS, HEAD_DIM, BATCH = 4, 64, 1


def inputs(total: int):
    torch.manual_seed(7)
    return [torch.randn(BATCH, HEADS, total, HEAD_DIM) for _ in range(3)]


def formula_bytes(total: int, ranks: int, backward: bool) -> float:
    """Bytes one rank sends: N-1 K/V slices forward; backward N-1 K/V slices plus N
    float32 dK/dV slices."""
    slice_kv = 2 * BATCH * HEADS * (total / ranks) * HEAD_DIM * 4
    sent = (ranks - 1) * slice_kv
    if backward:
        sent += (ranks - 1) * slice_kv + ranks * slice_kv
    return sent


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def timed(fn, repeats: int, sync=lambda: None) -> float:
    times = []
    for _ in range(repeats + 1):  # one warm-up
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def single_process(lengths, repeats, threads):
    import sdpa
    import sdpa.torch as st

    torch.set_num_threads(threads)
    sdpa.set_num_threads(threads)
    out = {}
    for i, total in enumerate(lengths):
        q, k, v = inputs(total)
        out[f"fwd_{total}"] = timed(
            lambda: sdpa.scaled_dot_product_attention(q, k, v, is_causal=True), repeats)
        if i == 0:
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

            def fwd_bwd():
                st.scaled_dot_product_attention(qg, kg, vg, is_causal=True).sum().backward()

            out[f"fwd_bwd_{total}"] = timed(fwd_bwd, repeats)
    return out


def rank_main(rank, ranks, port, lengths, repeats):
    import torch.distributed as dist

    import sdpa
    import sdpa.distributed as cp

    torch.set_num_threads(1)
    sdpa.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks, timeout=timedelta(seconds=600))
    out = {}

    def slowest(ms):
        t = torch.tensor([ms], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    for i, total in enumerate(lengths):
        q, k, v = (cp.shard(t, "zigzag", ranks, rank) for t in inputs(total))
        cp.reset_bytes_sent()
        call = lambda: cp.context_parallel_attention(q, k, v, is_causal=True, layout="zigzag")
        out[f"fwd_{total}"] = slowest(timed(call, repeats, dist.barrier))
        out[f"fwd_sent_{total}"] = cp.bytes_sent() / (repeats + 1)
        if i == 0:
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

            def fwd_bwd():
                cp.context_parallel_attention(qg, kg, vg, is_causal=True,
                                              layout="zigzag").sum().backward()

            cp.reset_bytes_sent()
            out[f"fwd_bwd_{total}"] = slowest(timed(fwd_bwd, repeats, dist.barrier))
            out[f"fwd_bwd_sent_{total}"] = cp.bytes_sent() / (repeats + 1)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seq-lens", default="16384,32768")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results as JSON")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(x) for x in args.seq_lens.split(",")]
    if args.rank is not None:
        return rank_main(args.rank, args.ranks, args.port, lengths, args.repeats)

    single = single_process(lengths, args.repeats, args.ranks)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                               "--ranks", str(args.ranks), "--seq-lens", args.seq_lens,
                               "--repeats", str(args.repeats)],
                              stdout=subprocess.PIPE, text=True, env=env)
             for r in range(args.ranks)]
    texts = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit("a rank failed")
    ring = json.loads(texts[0].strip().splitlines()[-1])

    rows = []
    for i, total in enumerate(lengths):
        for kind in (["fwd", "fwd_bwd"] if i == 0 else ["fwd"]):
            key = f"{kind}_{total}"
            sent = ring[f"{kind}_sent_{total}"]
            rows.append({"pass": "forward" if kind == "fwd" else "forward + backward",
                         "seq_len": total, "single_ms": single[key], "ring_ms": ring[key],
                         "ring_over_single": ring[key] / single[key], "sent_bytes": sent,
                         "formula_bytes": formula_bytes(total, args.ranks, kind == "fwd_bwd")})
    print(f"causal zigzag ring, {args.ranks} ranks x 1 thread vs 1 process x {args.ranks} "
          f"threads, B={BATCH} H={HEADS} E={HEAD_DIM} float32")
    for r in rows:
        print(f"{r['pass']:20s} L={r['seq_len']:6d}  single {r['single_ms']:9.1f} ms  ring "
              f"{r['ring_ms']:9.1f} ms  ring/single {r['ring_over_single']:.3f}  sent "
              f"{r['sent_bytes'] / 2**20:8.1f} MiB (formula {r['formula_bytes'] / 2**20:.1f})")
    if args.json:
        import sdpa

        doc = {"benchmark": "context_parallel",
               "command": "python3 " + shlex.join(["bench/context_parallel.py"] + sys.argv[1:]),
               "host": {"cpu_model": cpu_model(),
                        "cpu_capability": sdpa.backends.cpu.get_cpu_capability(),
                        "threads": args.ranks},
               "config": {"ranks": args.ranks, "batch": BATCH, "heads": HEADS,
                          "head_dim": HEAD_DIM, "dtype": "float32", "layout": "zigzag",
                          "causal": True, "repeats": args.repeats, "torch": torch.__version__},
               "results": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
