"""transformers continuous batching (generate_batch) with sdpa serving the "sdpa" name
against transformers' own SDPA implementation, on one small random Llama built from a
config, timed alternately in one process; the greedy tokens must agree.

    python bench/transformers_batching.py [--requests 16] [--rounds 3] [--json FILE]

Stock "sdpa" gathers every request's keys and runs one torch SDPA call over a dense
[total_q, total_k] mask; sdpa runs each step as one attention_varlen call (causal
bottom-right per request) over the cache's pages in place. A third run, "sdpa gathered",
takes transformers' gathered keys into the same varlen call, to show what reading the
pages in place saves. Needs torch, transformers 5.x and the sdpa package."""

import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import sdpa.integrations.transformers as sdpa_hf
from compare_torch import host


def model_and_prompts(requests: int):
    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, head_dim=32,
        max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(64, 1024, (requests,), generator=g).tolist()
    prompts = [torch.randint(1, 1024, (n,), generator=g).tolist() for n in lengths]
    return model, prompts


def generate(model, prompts, new_tokens: int):
    generation = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False,
                                               eos_token_id=None, pad_token_id=0)
    batching = transformers.ContinuousBatchingConfig(page_size=64, num_blocks=512,
                                                     max_batch_tokens=1024)
    start = time.perf_counter()
    out = model.generate_batch(inputs=prompts, generation_config=generation,
                               continuous_batching_config=batching, progress_bar=False)
    seconds = time.perf_counter() - start
    return seconds, {k: v.generated_tokens for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    model, prompts = model_and_prompts(args.requests)
    times = {"stock": [], "sdpa": [], "sdpa_gathered": []}
    tokens = {}
    store_in_pages = sdpa_hf._store_in_pages
    for _ in range(args.rounds):
        for name in times:
            if name != "stock":
                sdpa_hf.register("sdpa")
            if name == "sdpa_gathered":
                sdpa_hf._store_in_pages = lambda *args: None
            try:
                seconds, tokens[name] = generate(model, prompts, args.new_tokens)
            finally:
                transformers.AttentionInterface.register("sdpa", sdpa_attention_forward)
                sdpa_hf._store_in_pages = store_in_pages
            times[name].append(seconds)
    if any(tokens[name] != tokens["stock"] for name in times):
        print("the greedy tokens differ between stock sdpa and sdpa", file=sys.stderr)
        return 1
    median = {name: statistics.median(t) for name, t in times.items()}
    stock, ours, gathered = median["stock"], median["sdpa"], median["sdpa_gathered"]
    print(f"{args.requests} requests, prompts {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, {args.new_tokens} new tokens each, {torch.get_num_threads()} threads")
    print(f"stock sdpa {stock:.2f} s, sdpa {ours:.2f} s: {stock / ours:.2f}x "
          f"(sdpa on transformers' gathered keys {gathered:.2f} s: {stock / gathered:.2f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "transformers_batching", "command": " ".join(sys.argv),
                       "host": host(),
                       "config": vars(args),
                       "results": {"stock_s": times["stock"], "sdpa_s": times["sdpa"],
                                   "sdpa_gathered_s": times["sdpa_gathered"],
                                   "speedup": stock / ours,
                                   "speedup_gathered": stock / gathered}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
