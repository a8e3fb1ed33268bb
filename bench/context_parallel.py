#!/usr/bin/env python3
"""Context parallelism on this machine: the ring over N gloo ranks of one thread each
against one process running the whole sequence on N threads (issue 26's overhead, target
ring / single <= 1.15), and the bytes each rank sent against the ring's formula.

    python bench/context_parallel.py [--ranks 2] [--seq-lens 16384,32768] [--repeats 5]
                                     [--json out.json]

Causal attention over the zigzag layout (every rank the same work), B=1, Hq=Hkv=4,
E=64, float32; the forward at every length and forward + backward at the first. The
rank processes stay up and wait on their stdin while this process times a single call;
then it asks them for the same case, which they time between barriers, a call's time
being the slowest rank's. Single and ring calls alternate, so a noisy neighbour slows
both sides of a round: ring / single is the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import functools
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


def timed_once(fn, sync=lambda: None) -> float:
    """One call's milliseconds, after a pause that lets the other side's threads sleep."""
    time.sleep(0.05)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def cases(lengths):
    """The timed cases in order: (key, length, with backward)."""
    out = []
    for i, total in enumerate(lengths):
        out.append((f"fwd_{total}", total, False))
        if i == 0:
            out.append((f"fwd_bwd_{total}", total, True))
    return out


def single_calls(lengths, threads):
    """key -> the whole sequence's call in this process, on `threads` threads."""
    import sdpa
    import sdpa.torch as st

    torch.set_num_threads(threads)
    sdpa.set_num_threads(threads)

    def call(q, k, v, backward):
        if not backward:
            sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
            return
        st.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    calls = {}
    for key, total, backward in cases(lengths):
        q, k, v = inputs(total)
        if backward:
            q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        calls[key] = functools.partial(call, q, k, v, backward)
    return calls


def rank_main(rank, ranks, port, lengths):
    """Serves the parent: each stdin line names a case, timed once (rank 0 prints the
    slowest rank's ms and the bytes it sent); an empty line ends."""
    import torch.distributed as dist

    import sdpa
    import sdpa.distributed as cp

    torch.set_num_threads(1)
    sdpa.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks, timeout=timedelta(seconds=600))

    def call(q, k, v, backward):
        out = cp.context_parallel_attention(q, k, v, is_causal=True, layout="zigzag")
        if backward:
            out.sum().backward()

    calls = {}
    for key, total, backward in cases(lengths):
        q, k, v = (cp.shard(t, "zigzag", ranks, rank) for t in inputs(total))
        if backward:
            q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        calls[key] = functools.partial(call, q, k, v, backward)
    while key := sys.stdin.readline().strip():
        cp.reset_bytes_sent()
        t = torch.tensor([timed_once(calls[key], dist.barrier)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(json.dumps({"ms": float(t), "sent": cp.bytes_sent()}), flush=True)
    dist.destroy_process_group()


def start_ranks(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port),
                              "--ranks", str(args.ranks), "--seq-lens", args.seq_lens],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            for r in range(args.ranks)]


def ring_call(procs, key):
    """Has the ranks time case `key` once: rank 0's {"ms", "sent"}."""
    for p in procs:
        p.stdin.write(key + "\n")
        p.stdin.flush()
    line = procs[0].stdout.readline()
    if not line:
        sys.exit("a rank failed")
    return json.loads(line)


def measure(args, lengths):
    """Rows of alternating single and ring calls: a warm-up round, then `repeats`."""
    calls = single_calls(lengths, args.ranks)
    procs = start_ranks(args)
    rounds = {key: [] for key in calls}
    try:
        for round_index in range(args.repeats + 1):
            for key in calls:
                single_ms = timed_once(calls[key])
                ring = ring_call(procs, key)
                if round_index > 0:
                    rounds[key].append((single_ms, ring["ms"], ring["sent"]))
    finally:
        for p in procs:
            try:
                p.stdin.write("\n")
                p.stdin.close()
            except BrokenPipeError:  # a rank that failed has gone
                pass
        for p in procs:
            p.wait()
    rows = []
    for key, total, backward in cases(lengths):
        single, ring, sent = zip(*rounds[key])
        rows.append({"pass": "forward + backward" if backward else "forward",
                     "seq_len": total, "single_ms": statistics.median(single),
                     "ring_ms": statistics.median(ring),
                     "ring_over_single": statistics.median(r / s for s, r in zip(single, ring)),
                     "sent_bytes": statistics.median(sent),
                     "formula_bytes": formula_bytes(total, args.ranks, backward)})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seq-lens", default="16384,32768")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results as JSON")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(x) for x in args.seq_lens.split(",")]
    if args.rank is not None:
        return rank_main(args.rank, args.ranks, args.port, lengths)

    rows = measure(args, lengths)
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
                          "causal": True, "repeats": args.repeats, "interleaved": True,
                          "torch": torch.__version__},
               "results": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
