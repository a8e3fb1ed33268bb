#!/usr/bin/env python3
"""sdpa vs torch's scaled_dot_product_attention on a CUDA GPU, bfloat16, in one process.

Shapes keep the work per layer fixed: B*L = 16384 tokens and H*E = 2048 (E 64 -> H 32,
E 128 -> H 16), L in 512 .. 16384 (--quick: 1024, 4096, 8192), causal and not, the
forward and forward+backward. Contenders on identical random [B, H, L, E] inputs:

  sdpa         sdpa.scaled_dot_product_attention (its own choice; CUDNN_ATTENTION expected)
  sdpa-flash   the same inside sdpa.sdpa_kernel(FLASH_ATTENTION): sdpa's own CUDA kernels
               (forward only: their backward is not written yet)
  torch-cudnn  torch SDPA inside sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
  torch-flash  torch SDPA inside sdpa_kernel(SDPBackend.FLASH_ATTENTION)

Each is timed like triton.testing.do_bench: warm-up, then many repetitions, each bracketed
by CUDA events with the L2 cache flushed before it; the median is reported. TFLOP/s use
the standard count 4*B*H*L*S*E, halved when causal; the backward counts 2.5x the forward
(forward+backward 3.5x). sdpa's output is checked against torch-flash's first.

Host overhead: the time of N back-to-back calls on a small shape (B=1, H=8, L=128, E=64)
without synchronizing, divided by N, after warm-up (sdpa's cuDNN graph cache hits).

    python bench/compare_torch_cuda.py [--quick] [--json out.json]

Exits 0 with a message when there is no usable GPU (so it can be checked anywhere).
--quick finishes in well under 90 s on an H100.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import sdpa

TOKENS = 16384  # B * L
MODEL_DIM = 2048  # H * E
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (1024, 4096, 8192)
HEAD_DIMS = (64, 128)
DTYPE = torch.bfloat16
# Agreement of sdpa's output with torch-flash's, max |diff| / max |torch| (both round
# bf16 intermediates, differently).
TOLERANCE = 2e-2
# MATH materializes the [B, H, L, S] float32 scores: beyond this it is not worth timing.
MATH_SCORE_BYTES_LIMIT = 4 << 30
L2_FLUSH_BYTES = 256 << 20  # more than any current GPU's L2


def do_bench(fn, warmup_ms: float, rep_ms: float, setup=None) -> float:
    """Median milliseconds of fn() (triton.testing.do_bench's method): an estimate from 5
    calls sizes the warm-up and the repetitions (at least 10); every repetition runs
    after an L2 flush and `setup` (outside the timed region), between CUDA events."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    reps = max(10, int(rep_ms / estimate))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush.zero_()
        if setup is not None:
            setup()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def attention_fns(q, k, v, causal: bool) -> dict:
    """name -> (forward fn returning out)."""
    def torch_with(backend):
        def call():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return call

    def sdpa_flash():
        with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
            return sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return {
        "sdpa": lambda: sdpa.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "sdpa-flash": sdpa_flash,
        "torch-cudnn": torch_with(SDPBackend.CUDNN_ATTENTION),
        "torch-flash": torch_with(SDPBackend.FLASH_ATTENTION),
    }


def forward_flops(b: int, h: int, l: int, e: int, causal: bool) -> float:
    flops = 4.0 * b * h * l * l * e
    return flops / 2 if causal else flops


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.float() - expected.float()).abs().max()
    return (diff / expected.float().abs().max().clamp_min(1e-30)).item()


def run_shape(l: int, e: int, causal: bool, warmup_ms: float, rep_ms: float) -> list[dict]:
    b, h = TOKENS // l, MODEL_DIM // e
    q, k, v = (torch.randn(b, h, l, e, device="cuda", dtype=DTYPE) for _ in range(3))
    chosen = sdpa.scaled_dot_product_attention_with_lse(q, k, v, is_causal=causal).backend.name
    base = {"B": b, "H": h, "L": l, "S": l, "E": e, "causal": causal, "sdpa_backend": chosen}
    fns = attention_fns(q, k, v, causal)
    agreement = flash_agreement = None
    try:
        reference = fns["torch-flash"]()
        agreement = rel_error(fns["sdpa"](), reference)
        flash_agreement = rel_error(fns["sdpa-flash"](), reference)
    except RuntimeError as err:  # torch-flash unsupported: nothing to compare with
        print(f"  (no agreement check: {str(err).splitlines()[0]})", file=sys.stderr)
    for name, value in (("sdpa", agreement), ("sdpa-flash", flash_agreement)):
        if value is not None and value > TOLERANCE:
            print(f"  WARNING: L={l} E={e} causal={causal}: {name} differs from torch-flash "
                  f"by {value:.2e} (> {TOLERANCE})", file=sys.stderr)
    too_big = chosen == "MATH" and b * h * l * l * 4 > MATH_SCORE_BYTES_LIMIT
    grads = [x.detach().requires_grad_() for x in (q, k, v)]
    grad_out = torch.randn(b, h, l, e, device="cuda", dtype=DTYPE)
    backward_fns = attention_fns(*grads, causal)

    def clear_grads():
        for x in grads:
            x.grad = None

    rows = []
    fwd_flops = forward_flops(b, h, l, e, causal)
    for name in fns:
        for passes, flops in (("fwd", fwd_flops), ("fwd+bwd", 3.5 * fwd_flops)):
            row = dict(base, impl=name, passes=passes,
                       agreement=flash_agreement if name == "sdpa-flash" else agreement,
                       ms=None, tflops=None, error=None)
            if name == "sdpa" and too_big:
                row["error"] = "skipped: MATH would materialize the scores"
            elif name == "sdpa-flash" and passes != "fwd":
                row["error"] = "skipped: no CUDA FLASH backward yet"
            else:
                try:
                    if passes == "fwd":
                        with torch.no_grad():
                            ms = do_bench(fns[name], warmup_ms, rep_ms)
                    else:
                        fn = backward_fns[name]
                        ms = do_bench(lambda: fn().backward(grad_out), warmup_ms, rep_ms,
                                      setup=clear_grads)
                    row["ms"], row["tflops"] = ms, flops / ms / 1e9
                except RuntimeError as err:  # a torch backend that refuses the shape
                    row["error"] = str(err).splitlines()[0][:200]
            rows.append(row)
    del q, k, v, grads, grad_out
    torch.cuda.empty_cache()
    return rows


def host_overhead_us(calls: int = 200, rounds: int = 5) -> dict:
    """Microseconds of host time per call on a cache hit, per contender: N calls queued
    back to back (the GPU runs behind), median over rounds."""
    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=DTYPE) for _ in range(3))
    result = {}
    with torch.no_grad():
        for name, fn in attention_fns(q, k, v, causal=False).items():
            try:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                times = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    times.append((time.perf_counter() - t0) / calls * 1e6)
                    torch.cuda.synchronize()
                result[name] = statistics.median(times)
            except RuntimeError as err:
                result[name] = None
                print(f"  host overhead of {name}: {str(err).splitlines()[0]}", file=sys.stderr)
    return result


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: list[dict]) -> None:
    by_case: dict = {}
    for r in rows:
        by_case.setdefault((r["L"], r["E"], r["causal"], r["passes"]), {})[r["impl"]] = r
    print("| L | B | H | E | causal | pass | sdpa backend | sdpa ms | sdpa TFLOP/s "
          "| torch-cudnn TFLOP/s | torch-flash TFLOP/s | sdpa / best torch "
          "| sdpa-flash TFLOP/s | sdpa-flash / torch-flash |")
    print("|---:|---:|---:|---:|:---:|:---|:---|---:|---:|---:|---:|---:|---:|---:|")
    for (l, e, causal, passes), impls in by_case.items():
        s = impls["sdpa"]
        best = max((impls[n]["tflops"] or 0.0) for n in ("torch-cudnn", "torch-flash"))
        ratio = s["tflops"] / best if s["tflops"] and best else None
        own, fa2 = impls["sdpa-flash"]["tflops"], impls["torch-flash"]["tflops"]
        own_ratio = own / fa2 if own and fa2 else None
        print(f"| {l} | {s['B']} | {s['H']} | {e} | {'yes' if causal else 'no'} | {passes} "
              f"| {s['sdpa_backend']} | {fmt(s['ms'], '.3f')} | {fmt(s['tflops'], '.0f')} "
              f"| {fmt(impls['torch-cudnn']['tflops'], '.0f')} "
              f"| {fmt(impls['torch-flash']['tflops'], '.0f')} | {fmt(ratio, '.2f')} "
              f"| {fmt(own, '.0f')} | {fmt(own_ratio, '.2f')} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="L in 1024, 4096, 8192 and shorter timing budgets")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and sdpa.cuda.is_available()):
        reason = sdpa.cuda.unavailable_reason() or "torch sees no CUDA device"
        print(f"compare_torch_cuda: skipped, no usable GPU ({reason})")
        return 0

    gpu = torch.cuda.get_device_name(0)
    description = sdpa.cuda.device_description(0)
    print(f"GPU: {gpu}; {description}; torch {torch.__version__} (CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}); sdpa {sdpa.__version__} "
          f"(cuDNN backend built: {sdpa.cuda.cudnn_is_built()}); dtype bfloat16\n")
    warmup_ms, rep_ms = (10.0, 40.0) if args.quick else (25.0, 100.0)
    started = time.perf_counter()
    rows = []
    for l in QUICK_LENGTHS if args.quick else LENGTHS:
        for e in HEAD_DIMS:
            for causal in (False, True):
                rows += run_shape(l, e, causal, warmup_ms, rep_ms)
    print_table(rows)
    overhead = host_overhead_us()
    print("\nHost time per call on a cache hit (B=1, H=8, L=128, E=64, no sync), us: "
          + ", ".join(f"{n} {fmt(t, '.1f')}" for n, t in overhead.items()))
    print(f"sdpa cuDNN graph cache: {sdpa.cuda.graph_cache_stats()}")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({
            "benchmark": "compare_torch_cuda",
            "command": shlex.join(sys.argv),
            "gpu": gpu,
            "device_description": description,
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "torch_cudnn": torch.backends.cudnn.version(),
            "sdpa": sdpa.__version__,
            "sdpa_cudnn_built": sdpa.cuda.cudnn_is_built(),
            "config": {"dtype": "bfloat16", "tokens": TOKENS, "model_dim": MODEL_DIM,
                       "quick": args.quick, "warmup_ms": warmup_ms, "rep_ms": rep_ms},
            "rows": rows,
            "host_overhead_us": overhead,
            "graph_cache": sdpa.cuda.graph_cache_stats(),
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
