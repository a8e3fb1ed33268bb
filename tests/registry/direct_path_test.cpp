// The plain forward and backward run the selected CPU backend's kernel directly; the
// registry's CPU key serves the public op API (out=, in-place, call_op) and the CPU
// fallback of external backends. The CPU key's kernels are replaced here by counting
// ones that do what the built-in ones do, so the count shows which calls reach them.

#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "dispatch/backend_impl.h"
#include "registry/registry_impl.h"
#include "sdpa/registry.h"

namespace sdpa {
namespace {

std::atomic<int> g_out_calls{0};
std::atomic<int> g_backward_calls{0};

void counting_attention_out(OpCall& call) {
  ++g_out_calls;
  const AttentionParams& p = *call.params;
  detail::forward_into(detail::backend_impl(registry::cpu_backend_for(p, call.backend)), p,
                       call.args.at(0), call.args.at(1));
}

void counting_attention_backward(OpCall& call) {
  ++g_backward_calls;
  const AttentionParams& p = *call.params;
  detail::BackwardOutputs outputs = detail::allocate_backward_outputs(p);
  detail::backward_into(detail::backend_impl(registry::cpu_backend_for(p, call.backend)), p,
                        outputs);
  call.returns = {outputs.grad_q, outputs.grad_k, outputs.grad_v, outputs.grad_mask};
  call.tensor_list = std::move(outputs.grad_captured);
}

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (x.data<float>()[i] != y.data<float>()[i]) return false;
  }
  return true;
}

TEST(DirectPath, PlainCallsRunTheKernelAndTheOpApiGoesThroughTheRegistry) {
  backend_for(Device{})
      .impl_boxed("attention.out", counting_attention_out)
      .impl_boxed("attention_backward", counting_attention_backward);
  // GQA with odd sizes: Hq = 6 over Hkv = 2, L = 7, S = 65, E = 33.
  const Tensor q = random_tensor({2, 6, 7, 33}, 1);
  const Tensor k = random_tensor({2, 2, 65, 33}, 2);
  const Tensor v = random_tensor({2, 2, 65, 33}, 3);
  SDPAOptions options;
  options.is_causal = true;
  options.enable_gqa = true;

  for (SDPBackend backend : {SDPBackend::FLASH_ATTENTION, SDPBackend::MATH}) {
    SCOPED_TRACE(std::string(backend_name(backend)));
    sdpa_kernel only(backend);
    g_out_calls = 0;
    g_backward_calls = 0;
    const AttentionResult plain = scaled_dot_product_attention_with_lse(q, k, v, options);
    EXPECT_EQ(plain.backend, backend);
    EXPECT_EQ(g_out_calls, 0);

    Tensor out, lse;
    const AttentionResult via_op = scaled_dot_product_attention_out(q, k, v, out, lse, options);
    EXPECT_EQ(g_out_calls, 1);
    EXPECT_EQ(via_op.backend, backend);
    EXPECT_TRUE(bitwise_equal(plain.out, out));
    EXPECT_TRUE(bitwise_equal(plain.lse, lse));

    const Tensor grad_out = random_tensor(plain.out.sizes(), 4);
    const AttentionGradients g = scaled_dot_product_attention_backward(
        grad_out, q, k, v, plain.out, plain.lse, options);
    EXPECT_EQ(g.backend, backend);
    EXPECT_EQ(g_backward_calls, 0);
    EXPECT_EQ(g.grad_q.sizes(), q.sizes());
    EXPECT_EQ(g.grad_k.sizes(), k.sizes());
  }
}

}  // namespace
}  // namespace sdpa
