"""torch CUDA tensors through the torch custom op under torch.compile, and a transformers
model on device="cuda" with attn_implementation="sdpa_cpp". Skipped without a GPU."""

from __future__ import annotations

import pytest

import sdpa

torch = pytest.importorskip("torch")

gpu = pytest.mark.skipif(
    not (sdpa.cuda.is_available() and torch.cuda.is_available()),
    reason=sdpa.cuda.unavailable_reason() or "torch sees no CUDA device")


def _randn(*shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_torch_compile_fullgraph_on_cuda_matches_eager(dtype):
    q = _randn(2, 8, 129, 64, dtype=dtype, seed=1).requires_grad_()
    k = _randn(2, 2, 127, 64, dtype=dtype, seed=2).requires_grad_()
    v = _randn(2, 2, 127, 64, dtype=dtype, seed=3).requires_grad_()

    def layer(q, k, v):
        out = sdpa.torch.scaled_dot_product_attention(q.tanh(), k, v, is_causal=True,
                                                      enable_gqa=True)
        return out.float().square().mean()

    compiled = torch.compile(layer, fullgraph=True)
    eager = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    loss_c, loss_e = compiled(q, k, v), layer(*eager)
    loss_c.backward()
    loss_e.backward()
    assert loss_c.is_cuda
    torch.testing.assert_close(loss_c, loss_e)
    for a, b in zip((q, k, v), eager):
        assert a.grad.is_cuda and a.grad.dtype == dtype
        torch.testing.assert_close(a.grad, b.grad)


@gpu
def test_transformers_model_on_cuda_matches_stock_sdpa():
    transformers = pytest.importorskip("transformers")
    import sdpa.integrations.transformers as sdpa_hf

    assert sdpa_hf.register() == "sdpa_cpp"

    def tiny_llama(attn_implementation):
        config = transformers.LlamaConfig(
            vocab_size=97, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            max_position_embeddings=256, attn_implementation=attn_implementation)
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()

    stock, ours = tiny_llama("sdpa"), tiny_llama("sdpa_cpp")
    ours.load_state_dict(stock.state_dict())
    assert ours.config._attn_implementation == "sdpa_cpp"
    ids = torch.randint(1, 97, (3, 37), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0  # left padding
    with torch.no_grad():
        want = stock(input_ids=ids, attention_mask=mask).logits.float()
        got = ours(input_ids=ids, attention_mask=mask).logits.float()
    keep = mask.bool()
    # bfloat16 through two layers: compare against the logits' own scale.
    error = (got[keep] - want[keep]).abs().max() / want[keep].abs().max()
    assert error.item() <= 3e-2
