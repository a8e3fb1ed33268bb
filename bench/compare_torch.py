#!/usr/bin/env python3
"""sdpa vs torch.nn.functional.scaled_dot_product_attention on the CPU, in one process.

For every case of docs/benchmarks.md's CPU performance table (or --quick), both libraries
get identical inputs and the same thread count; the outputs (and gradients) are checked
to agree, then both are timed interleaved (round-robin, median of --repeats), so machine
noise hits both alike. Prints per case: ms of each, torch/sdpa (the speed-up), GFLOP/s
(forward 4*B*Hq*L*S*E, halved when causal; backward 2.5x forward: FlashAttention's
convention) and the percentage of this machine's peak measured in the same run by
`sdpa bench --peak-only` (fp32 FMA for float32/float16, vdpbf16ps for bfloat16; decode
cases as a fraction of copy bandwidth, counting the K/V bytes read).

    python bench/compare_torch.py [--quick] [--threads 2] [--repeats 7] [--json out.json]
    python bench/compare_torch.py --small     # small calls, idle and beside a busy process

--small times issue 27's small calls (a tiny decode, the all-MiniLM-L6-v2 layer and a
Llama-7B-shaped decode step, float32) in microseconds per call, in two settings: as the
machine is, and with a second process (`yes`) keeping one processor busy, which the
script starts and stops. That is where OpenMP threads waiting for a processor show.

--json writes {"benchmark", "command", "host", "config", "peaks", "rows"}, every figure a
JSON number (pct_of_peak null where the peaks were not measured).

Needs the sdpa Python package and torch; --sdpa-cli names the `sdpa` command (default:
build/release/tools/sdpa) for the peak figures (omitted when it is missing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import sdpa

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Agreement bounds, max |sdpa - torch| / max |torch| (both compute half types in float32,
# but round intermediates differently).
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 4e-3}


@dataclasses.dataclass
class Case:
    name: str
    batch: int
    heads_q: int
    heads_kv: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str
    causal: bool
    backward: bool = False
    calls: int = 1  # calls per timed sample: small calls are timed in batches
    autograd: bool = False  # forward + backward through each library's autograd


    def flops(self) -> float:
        fwd = 4.0 * self.batch * self.heads_q * self.q_len * self.kv_len * self.head_dim
        if self.causal:
            fwd /= 2.0
        return 2.5 * fwd if self.backward else fwd

    def kv_bytes(self) -> int:
        element = torch.tensor([], dtype=DTYPES[self.dtype]).element_size()
        return 2 * self.batch * self.heads_kv * self.kv_len * self.head_dim * element

    @property
    def is_decode(self) -> bool:
        return self.q_len == 1


def table_cases(quick: bool) -> list[Case]:
    """The rows of issue 8's target table (smaller sequences with --quick)."""
    n = 512 if quick else 2048
    cases = []
    for dtype in ("float32", "bfloat16", "float16"):
        for e in (64, 128):
            for causal in (False, True):
                cases.append(Case("fwd", 1, 16, 16, n, n, e, dtype, causal))
    for dtype in ("float32", "bfloat16"):
        for e in (64, 128):
            for causal in (False, True):
                cases.append(Case("bwd", 1, 16, 16, n, n, e, dtype, causal, backward=True))
    long = 1024 if quick else 4096
    cases.append(Case("llama-gqa", 1, 32, 8, long, long, 128, "bfloat16", True))
    cases.append(Case("causal-4096", 1, 16, 16, long, long, 64, "float32", False))
    cases.append(Case("causal-4096", 1, 16, 16, long, long, 64, "float32", True))
    for s in ((4096,) if quick else (4096, 32768)):
        cases.append(Case("decode", 1, 32, 8, 1, s, 128, "bfloat16", False))
    for length in ((512, 1024) if quick else (512, 1024, 2048, 4096, 8192, 16384)):
        cases.append(Case("length-sweep", 1, 16, 16, length, length, 64, "float32", False))
    return cases


def small_cases() -> list[Case]:
    """Issue 27's small calls: q/k/v [1, 1, 1, 8], the MiniLM layer [5, 12, 27, 32] (also
    forward + backward through autograd, inputs requiring grad) and a Llama-7B decode step,
    q [1, 32, 1, 128] with k/v [1, 32, 128, 128]."""
    return [Case("small-tiny", 1, 1, 1, 1, 1, 8, "float32", False, calls=200),
            Case("small-minilm", 5, 12, 12, 27, 27, 32, "float32", False, calls=20),
            Case("small-minilm-grad", 5, 12, 12, 27, 27, 32, "float32", False, calls=10,
                 autograd=True),
            Case("small-llama", 1, 32, 32, 1, 128, 128, "float32", False, calls=20)]


def make_inputs(c: Case, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[c.dtype]
    q = torch.randn(c.batch, c.heads_q, c.q_len, c.head_dim, generator=g).to(dtype)
    k = torch.randn(c.batch, c.heads_kv, c.kv_len, c.head_dim, generator=g).to(dtype)
    v = torch.randn(c.batch, c.heads_kv, c.kv_len, c.head_dim, generator=g).to(dtype)
    return q, k, v


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.double(), expected.double()
    return float((a - e).abs().max() / e.abs().max().clamp_min(1e-30))


def callables(c: Case):
    """(torch_fn, sdpa_fn, check): the timed calls and a function returning the worst
    relative disagreement of their results."""
    q, k, v = make_inputs(c)
    gqa = c.heads_q != c.heads_kv
    if c.autograd:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        grad = torch.randn(c.batch, c.heads_q, c.q_len, c.head_dim,
                           generator=torch.Generator().manual_seed(1)).to(DTYPES[c.dtype])

        def through(attention):
            def call():
                out = attention(*leaves, is_causal=c.causal, enable_gqa=gqa)
                return torch.autograd.grad(out, leaves, grad)
            return call

        torch_fn = through(F.scaled_dot_product_attention)
        sdpa_fn = through(sdpa.scaled_dot_product_attention)
        return torch_fn, sdpa_fn, lambda: max(
            rel_error(a, b) for a, b in zip(sdpa_fn(), torch_fn()))
    if not c.backward:
        def torch_fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=c.causal, enable_gqa=gqa)

        def sdpa_fn():
            return sdpa.scaled_dot_product_attention(q, k, v, is_causal=c.causal, enable_gqa=gqa)

        return torch_fn, sdpa_fn, lambda: rel_error(sdpa_fn(), torch_fn())

    grad_out = torch.randn(c.batch, c.heads_q, c.q_len, c.head_dim,
                           generator=torch.Generator().manual_seed(1)).to(DTYPES[c.dtype])
    tq, tk, tv = (t.clone().requires_grad_() for t in (q, k, v))
    t_out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=c.causal, enable_gqa=gqa)
    fwd = sdpa.scaled_dot_product_attention_with_lse(q, k, v, is_causal=c.causal, enable_gqa=gqa)

    def torch_fn():
        return torch.autograd.grad(t_out, (tq, tk, tv), grad_out, retain_graph=True)

    def sdpa_fn():
        g = sdpa.scaled_dot_product_attention_backward(
            grad_out, q, k, v, fwd.out, fwd.lse, is_causal=c.causal, enable_gqa=gqa)
        return g.grad_q, g.grad_k, g.grad_v

    def check():
        return max(rel_error(a, b) for a, b in zip(sdpa_fn(), torch_fn()))

    return torch_fn, sdpa_fn, check


def paired_median_ms(fns, repeats: int, calls: int = 1) -> list[float]:
    """Median ms per call of each function, timed round-robin in samples of `calls`."""
    for fn in fns:  # warm-up: first-touch allocations, thread pools
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[i].append((time.perf_counter() - t0) * 1e3 / calls)
    return [statistics.median(t) for t in times]


def run_small(repeats: int) -> list[dict]:
    """Microseconds per small call, as the machine is and beside a busy `yes`."""
    print(f"{'case':<13} {'shape':<34} {'setting':<8} {'torch us':>9} {'sdpa us':>9} "
          f"{'speedup':>8} {'max rel err':>11}")
    rows = []
    for setting in ("as-is", "busy"):
        busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) if setting == "busy" else None
        try:
            for c in small_cases():
                torch_fn, sdpa_fn, check = callables(c)
                err = check()
                torch_ms, sdpa_ms = paired_median_ms([torch_fn, sdpa_fn], repeats, c.calls)
                shape = f"B={c.batch} Hq={c.heads_q} Hkv={c.heads_kv} L={c.q_len} S={c.kv_len} E={c.head_dim}"
                rows.append(dict(dataclasses.asdict(c), setting=setting, torch_us=1e3 * torch_ms,
                                 sdpa_us=1e3 * sdpa_ms, max_rel_err=err,
                                 agree=err <= TOLERANCE[c.dtype]))
                print(f"{c.name:<13} {shape:<34} {setting:<8} {1e3 * torch_ms:9.1f} "
                      f"{1e3 * sdpa_ms:9.1f} {torch_ms / sdpa_ms:7.2f}x {err:11.2e}", flush=True)
        finally:
            if busy:
                busy.kill()
                busy.wait()
    return rows


def measure_peaks(cli: Path) -> dict[str, float]:
    if not cli.exists():
        return {}
    text = subprocess.run([str(cli), "bench", "--peak-only", "--json"], check=True,
                          capture_output=True, text=True).stdout
    context = json.loads(text)["context"]
    return {key: value for key, value in context.items()
            if key.startswith("peak_") and isinstance(value, (int, float))}


def percent_of_peak(c: Case, sdpa_ms: float, peaks: dict[str, float]) -> tuple[float | None, str]:
    """(sdpa's percentage of the limit that bounds case `c`, or None when not measured;
    which limit: "copy" for decode (K/V bytes read), else "bf16" or "fp32")."""
    if c.is_decode:
        limit = peaks.get("peak_copy_gbps")
        achieved = c.kv_bytes() / (sdpa_ms * 1e6)  # GB/s of K/V read
        return (100 * achieved / limit if limit else None), "copy"
    # bfloat16 products run on AMX tiles, else vdpbf16ps, where the CPU has them; without
    # either bf16 computes in float32.
    if c.dtype == "bfloat16" and "peak_amx_bf16_gflops" in peaks:
        key, name = "peak_amx_bf16_gflops", "amx"
    elif c.dtype == "bfloat16" and "peak_bf16_gflops" in peaks:
        key, name = "peak_bf16_gflops", "bf16"
    else:
        key, name = "peak_fp32_gflops", "fp32"
    limit = peaks.get(key)
    return (100 * c.flops() / (sdpa_ms * 1e6) / limit if limit else None), name


def host() -> dict:
    """The host fields every benchmark JSON records (bench/host.h in C++)."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu_model": model, "cpu_capability": sdpa.backends.cpu.get_cpu_capability(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": sdpa.backends.cpu.amx_bf16_available(),
            "threads": torch.get_num_threads()}


def write_json(args, benchmark: str, peaks: dict, rows: list[dict]) -> None:
    """Writes --json: {"benchmark", "command", "host", "config", "peaks", "rows"}."""
    if not args.json:
        return
    # The command as run from the repository root with any Python that has torch and sdpa.
    command = shlex.join(["python3", os.path.relpath(sys.argv[0])] + sys.argv[1:])
    args.json.write_text(json.dumps(
        {"benchmark": benchmark, "command": command, "host": host(),
         "config": {"torch": torch.__version__, "sdpa": sdpa.__version__,
                    "threads": args.threads, "repeats": args.repeats, "quick": args.quick},
         "peaks": peaks, "rows": rows}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sequence lengths")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--sdpa-cli", type=Path,
                        default=Path(__file__).resolve().parents[1] / "build/release/tools/sdpa")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--small", action="store_true",
                        help="only the small calls, as-is and beside a busy process")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    sdpa.set_num_threads(args.threads)
    peaks = measure_peaks(args.sdpa_cli)
    print(f"torch {torch.__version__}, sdpa {sdpa.__version__}, {args.threads} threads, "
          f"capability {sdpa.backends.cpu.get_cpu_capability()}, peaks {peaks or 'not measured'}")
    if args.small:
        rows = run_small(args.repeats)
        write_json(args, "compare_torch_small", peaks, rows)
        return 0 if all(r["agree"] for r in rows) else 1
    header = (f"{'case':<13} {'shape':<34} {'dtype':<9} {'causal':<6} {'torch ms':>9} "
              f"{'sdpa ms':>9} {'speedup':>8} {'GFLOP/s':>8} {'of peak':>13} {'max rel err':>11}")
    print(header)
    rows, failures = [], 0
    for c in table_cases(args.quick):
        if args.only not in c.name:
            continue
        torch_fn, sdpa_fn, check = callables(c)
        err = check()
        ok = err <= TOLERANCE[c.dtype] * (4 if c.backward else 1)
        failures += not ok
        torch_ms, sdpa_ms = paired_median_ms([torch_fn, sdpa_fn], args.repeats)
        shape = f"B={c.batch} Hq={c.heads_q} Hkv={c.heads_kv} L={c.q_len} S={c.kv_len} E={c.head_dim}"
        gflops = c.flops() / (sdpa_ms * 1e6)
        pct, limit = percent_of_peak(c, sdpa_ms, peaks)
        rows.append(dict(dataclasses.asdict(c), torch_ms=torch_ms, sdpa_ms=sdpa_ms,
                         speedup=torch_ms / sdpa_ms, sdpa_gflops=gflops, pct_of_peak=pct,
                         peak=limit, max_rel_err=err, agree=ok))
        of_peak = "-" if pct is None else f"{pct:.0f}%" + (" copy bw" if limit == "copy" else "")
        print(f"{c.name + (' bwd' if c.backward and c.name != 'bwd' else ''):<13} {shape:<34} "
              f"{c.dtype:<9} {str(c.causal):<6} {torch_ms:9.2f} {sdpa_ms:9.2f} "
              f"{torch_ms / sdpa_ms:7.2f}x {gflops:8.1f} {of_peak:>13} {err:11.2e}"
              f"{'' if ok else '  DISAGREE'}", flush=True)
    write_json(args, "compare_torch", peaks, rows)
    if failures:
        print(f"{failures} case(s) disagree with torch beyond tolerance", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
