#!/usr/bin/env python3
"""sdpa's flex attention on a CUDA GPU (score_mods lowered to cuDNN) vs torch's compiled
flex_attention, bfloat16, in one process.

Shapes: B*L = 16384 tokens, H = 16, (E, L) in (128, 1024), (64, 4096), (128, 8192).
score_mods, the same Python function for both libraries:

  soft_cap   20 * tanh(score / 20)                       (Gemma 2)
  alibi      causal ALiBi: where(q_idx >= kv_idx, score - slopes[h] * (q_idx - kv_idx),
             -inf) (slopes 2^(-8 (h+1) / H); no BlockMask, so every block is computed by
             both libraries; sdpa runs the backward of captured-tensor score_mods on cuDNN
             only when they end in such a mask select)
  document   no score_mod; a BlockMask of the mask_mod doc[q_idx] == doc[kv_idx] over
             documents of random lengths (each library builds its own, once per shape)

Contenders on identical random inputs, forward and forward+backward:

  sdpa-flex     sdpa.flex.flex_attention (traced per call; the backend sdpa selects)
  torch-flex    torch.compile(torch.nn.attention.flex_attention.flex_attention)
  sdpa-plain    sdpa.scaled_dot_product_attention without a score_mod (the score_mod's
                overhead on sdpa's default path is sdpa-plain time / sdpa-flex time)
  sdpa-flash    sdpa.flex.flex_attention on sdpa's own CUDA FLASH kernel compiled by
                NVRTC with the programs, forward only

Timing as bench/compare_torch_cuda.py (CUDA events, L2 flushed, median). sdpa's output is
checked against torch-flex's first. Also times sdpa.flex.create_block_mask for a causal
mask at L = 131072 (built on the CPU by interval analysis, O(blocks) memory).

    python bench/compare_flex_cuda.py [--quick] [--json out.json]

--quick: the (128, 4096) shape alone.

Exits 0 with a message when there is no usable GPU.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

import sdpa
from compare_torch_cuda import do_bench, fmt, rel_error

TOKENS = 16384
HEADS = 16
SHAPES = ((128, 1024), (64, 4096), (128, 8192))  # (E, L)
DTYPE = torch.bfloat16
TOLERANCE = 2e-2
BLOCK_MASK_LEN = 131072


def make_mods(heads: int) -> dict:
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                          device="cuda")

    def soft_cap(score, b, h, q_idx, kv_idx):
        return 20.0 * torch.tanh(score / 20.0)

    def alibi(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score - slopes[h] * (q_idx - kv_idx),
                           -float("inf"))

    return {"soft_cap": soft_cap, "alibi": alibi, "document": None}


def document_masks(l: int) -> tuple:
    """torch's and sdpa's BlockMask of documents of random lengths (8 to l/4 tokens) over a
    sequence of l, for every batch row and head."""
    generator = torch.Generator().manual_seed(l)
    lengths = []
    while sum(lengths) < l:
        lengths.append(int(torch.randint(8, max(9, l // 4), (1,), generator=generator)))
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:l]
    doc_cuda = doc.to("cuda")

    def torch_mask(b, h, q_idx, kv_idx):
        return doc_cuda[q_idx] == doc_cuda[kv_idx]

    def sdpa_mask(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    from torch.nn.attention.flex_attention import create_block_mask as torch_block_mask
    return (torch_block_mask(torch_mask, None, None, l, l, device="cuda"),
            sdpa.flex.create_block_mask(sdpa_mask, None, None, l, l))


def flash(fn):
    """fn run with sdpa's CUDA FLASH kernel as the only backend."""
    def run(*args):
        with sdpa.sdpa_kernel(sdpa.SDPBackend.FLASH_ATTENTION):
            return fn(*args)
    return run


def run_shape(e: int, l: int, warmup_ms: float, rep_ms: float) -> list[dict]:
    from torch.nn.attention.flex_attention import flex_attention as torch_flex
    b = TOKENS // l
    q, k, v = (torch.randn(b, HEADS, l, e, device="cuda", dtype=DTYPE) for _ in range(3))
    grad_out = torch.randn(b, HEADS, l, e, device="cuda", dtype=DTYPE)
    grads = [x.detach().requires_grad_() for x in (q, k, v)]

    def clear_grads():
        for x in grads:
            x.grad = None

    flops = 4.0 * b * HEADS * l * l * e
    rows = []
    torch_docs, sdpa_docs = document_masks(l)
    for mod_name, mod in make_mods(HEADS).items():
        # A fresh compilation per shape and mod: past torch.compile's recompile limit
        # (8 by default) flex_attention silently runs unfused and tens of times slower.
        torch._dynamo.reset()
        compiled = torch.compile(torch_flex, dynamic=False)
        torch_mask, sdpa_mask = (torch_docs, sdpa_docs) if mod_name == "document" else (None,
                                                                                        None)

        def sdpa_flex(x, y, z, mod=mod, sdpa_mask=sdpa_mask):
            return sdpa.flex.flex_attention(x, y, z, score_mod=mod, block_mask=sdpa_mask)

        fns = {
            "sdpa-flex": sdpa_flex,
            "torch-flex": lambda x, y, z, mod=mod, mask=torch_mask: compiled(
                x, y, z, score_mod=mod, block_mask=mask),
            "sdpa-plain": lambda x, y, z: sdpa.scaled_dot_product_attention(x, y, z),
            "sdpa-flash": flash(sdpa_flex),
        }
        agreement = None
        try:
            agreement = rel_error(fns["sdpa-flex"](q, k, v), fns["torch-flex"](q, k, v))
        except Exception as err:  # noqa: BLE001 - a contender that cannot run the shape
            print(f"  (no agreement check: {str(err).splitlines()[0][:200]})", file=sys.stderr)
        if agreement is not None and agreement > TOLERANCE:
            print(f"  WARNING: {mod_name} E={e} L={l}: sdpa-flex differs from torch-flex by "
                  f"{agreement:.2e}", file=sys.stderr)
        with torch.no_grad():
            backend = sdpa.explain(q, k, v).chosen.name
        for name, fn in fns.items():
            for passes, count in (("fwd", flops), ("fwd+bwd", 3.5 * flops)):
                if name == "sdpa-flash" and passes != "fwd":
                    continue  # the CUDA FLASH kernels have no backward yet
                row = {"mod": mod_name, "impl": name, "passes": passes, "B": b, "H": HEADS,
                       "L": l, "E": e, "agreement": agreement, "ms": None, "tflops": None,
                       "error": None, "plain_backend": backend}
                try:
                    if passes == "fwd":
                        with torch.no_grad():
                            ms = do_bench(lambda: fn(q, k, v), warmup_ms, rep_ms)
                    else:
                        ms = do_bench(lambda: fn(*grads).backward(grad_out), warmup_ms, rep_ms,
                                      setup=clear_grads)
                    row["ms"], row["tflops"] = ms, count / ms / 1e9
                except Exception as err:  # noqa: BLE001
                    row["error"] = str(err).splitlines()[0][:200]
                rows.append(row)
    del q, k, v, grads, grad_out
    torch.cuda.empty_cache()
    return rows


def block_mask_ms() -> dict:
    """Milliseconds and block count of sdpa's create_block_mask for a causal mask at
    L = S = 131072 (median of 5)."""
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    times = []
    mask = None
    for _ in range(5):
        t0 = time.perf_counter()
        mask = sdpa.flex.create_block_mask(causal, 1, 1, BLOCK_MASK_LEN, BLOCK_MASK_LEN)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"L": BLOCK_MASK_LEN, "ms": times[len(times) // 2],
            "kv_blocks": mask._cpp.num_kv_blocks}


def print_table(rows: list[dict]) -> None:
    by_case: dict = {}
    for r in rows:
        by_case.setdefault((r["mod"], r["E"], r["L"], r["passes"]), {})[r["impl"]] = r
    print("| score_mod | E | L | B | pass | sdpa-flex ms | torch-flex ms | sdpa-plain ms "
          "| sdpa-flash ms | sdpa-flex / torch-flex | sdpa-flash / torch-flex "
          "| score_mod overhead | agreement |")
    print("|:---|---:|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (mod, e, l, passes), impls in by_case.items():
        s, t, p = impls["sdpa-flex"], impls["torch-flex"], impls["sdpa-plain"]
        f = impls.get("sdpa-flash", {"ms": None, "error": None, "impl": "sdpa-flash"})

        def speedup(r):
            return t["ms"] / r["ms"] if r["ms"] and t["ms"] else None

        # The document rows have a BlockMask, not a score_mod: no overhead to speak of.
        overhead = s["ms"] / p["ms"] if s["ms"] and p["ms"] and mod != "document" else None
        print(f"| {mod} | {e} | {l} | {s['B']} | {passes} | {fmt(s['ms'], '.3f')} "
              f"| {fmt(t['ms'], '.3f')} | {fmt(p['ms'], '.3f')} | {fmt(f['ms'], '.3f')} "
              f"| {fmt(speedup(s), '.2f')} | {fmt(speedup(f), '.2f')} "
              f"| {fmt(overhead, '.2f')} | {fmt(s['agreement'], '.1e')} |")
        for r in (s, t, p, f):
            if r["error"]:
                print(f"|   {r['impl']} {passes}: {r['error']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="E=128, L=4096 only")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    if not (torch.cuda.is_available() and sdpa.cuda.is_available()):
        reason = sdpa.cuda.unavailable_reason() or "torch sees no CUDA device"
        print(f"compare_flex_cuda: skipped, no usable GPU ({reason})")
        return 0
    gpu = torch.cuda.get_device_name(0)
    print(f"GPU: {gpu}; {sdpa.cuda.device_description(0)}; torch {torch.__version__}; "
          f"sdpa {sdpa.__version__}; bfloat16, H={HEADS}, B*L={TOKENS}\n")
    started = time.perf_counter()
    rows = []
    for e, l in ((128, 4096),) if args.quick else SHAPES:
        rows += run_shape(e, l, warmup_ms=10.0, rep_ms=40.0)
    print_table(rows)
    masks = block_mask_ms()
    print(f"\nsdpa create_block_mask, causal, L = S = {masks['L']}: {masks['ms']:.2f} ms "
          f"({masks['kv_blocks']} kv blocks per row of blocks)")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({
            "benchmark": "compare_flex_cuda", "command": shlex.join(sys.argv), "gpu": gpu,
            "device_description": sdpa.cuda.device_description(0), "torch": torch.__version__,
            "sdpa": sdpa.__version__, "config": {"dtype": "bfloat16", "tokens": TOKENS,
                                                "heads": HEADS, "quick": args.quick,
                                                "shapes": SHAPES},
            "rows": rows, "block_mask": masks}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
