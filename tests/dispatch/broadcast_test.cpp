// Inputs of other ranks and broadcast key/value dimensions (broadcast.h): each call must
// equal the same call written out in 4-D with the broadcast made explicit, and gradients
// must come back shaped like each input, summed over the dimensions it was broadcast along.

#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;

// Sums a [*lead, N, D] gradient over leading dimensions down to `shape` (reference side).
Tensor reduce_reference(const Tensor& full, const Shape& shape) {
  Tensor out = Tensor::zeros(shape, DType::kFloat64);
  const int64_t lead = full.dim() - static_cast<int64_t>(shape.size());
  for_each_index(full.sizes(), [&](const Shape& i) {
    Shape j(shape.size(), 0);
    for (size_t d = 0; d < shape.size(); ++d) j[d] = shape[d] == 1 ? 0 : i[lead + d];
    out.set_item(j, out.item(j) + full.item(i));
  });
  return out;
}

struct Shapes {
  Shape q, k, v, explicit_kv;  // explicit_kv: k/v written out at q's 4-D batch and heads
  bool gqa = false;
};

void check(const Shapes& s, SDPBackend backend) {
  SCOPED_TRACE("q " + sdpa::shape_str(s.q) + " k " + sdpa::shape_str(s.k) + " on " +
               std::string(sdpa::backend_name(backend)));
  const Tensor q = randn(s.q, DType::kFloat64, 1);
  const Tensor k = randn(s.k, DType::kFloat64, 2);
  const Tensor v = randn(s.v, DType::kFloat64, 3);
  Shape out_shape = s.q;
  out_shape.back() = s.v.back();
  const Tensor grad_out = randn(out_shape, DType::kFloat64, 4);
  SDPAOptions o;
  o.is_causal = true;
  o.enable_gqa = s.gqa;
  const FwdBwd r = run_fwd_bwd(backend, q, k, v, grad_out, o);
  ASSERT_EQ(r.fwd.out.sizes(), out_shape);
  ASSERT_EQ(r.grads.grad_q.sizes(), q.sizes());
  ASSERT_EQ(r.grads.grad_k.sizes(), k.sizes());
  ASSERT_EQ(r.grads.grad_v.sizes(), v.sizes());

  // The explicit call: q as [B, H, L, E] (leading dims flattened), k/v expanded and copied.
  const int64_t l = s.q[s.q.size() - 2];
  int64_t batch = 1;
  for (size_t d = 0; d + 3 < s.q.size(); ++d) batch *= s.q[d];
  const int64_t heads = s.q.size() >= 3 ? s.q[s.q.size() - 3] : 1;
  const Tensor q4 = q.contiguous().view({batch, heads, l, s.q.back()});
  Shape k_full(s.q.begin(), s.q.end() - 2), v_full;
  if (s.gqa) k_full.back() = s.explicit_kv[1];
  v_full = k_full;
  k_full.push_back(s.k[s.k.size() - 2]);
  k_full.push_back(s.k.back());
  v_full.push_back(s.v[s.v.size() - 2]);
  v_full.push_back(s.v.back());
  const Tensor k4 = k.expand(k_full).contiguous().view(s.explicit_kv);
  Shape v_explicit = s.explicit_kv;
  v_explicit.back() = s.v.back();
  const Tensor v4 = v.expand(v_full).contiguous().view(v_explicit);
  const FwdBwd e = run_fwd_bwd(SDPBackend::MATH, q4, k4, v4,
                               grad_out.contiguous().view({batch, heads, l, s.v.back()}), o);
  EXPECT_TRUE(close_to("out", r.fwd.out.contiguous().view(e.fwd.out.sizes()), e.fwd.out,
                       DType::kFloat64));
  EXPECT_TRUE(close_to("grad_q", r.grads.grad_q.contiguous().view(e.grads.grad_q.sizes()),
                       e.grads.grad_q, DType::kFloat64));
  EXPECT_TRUE(close_to("grad_k", r.grads.grad_k,
                       reduce_reference(e.grads.grad_k.view(k_full), s.k), DType::kFloat64));
  EXPECT_TRUE(close_to("grad_v", r.grads.grad_v,
                       reduce_reference(e.grads.grad_v.view(v_full), s.v), DType::kFloat64));
}

TEST(Broadcast, OtherRanksAndBroadcastKeyValues) {
  const Shapes cases[] = {
      {{7, 16}, {9, 16}, {9, 12}, {1, 1, 9, 16}},                            // 2-D
      {{2, 3, 4, 7, 16}, {2, 3, 4, 9, 16}, {2, 3, 4, 9, 12}, {6, 4, 9, 16}},  // 5-D
      {{3, 4, 7, 16}, {1, 4, 9, 16}, {1, 4, 9, 12}, {3, 4, 9, 16}},          // k/v batch 1
      {{3, 4, 7, 16}, {4, 9, 16}, {4, 9, 12}, {3, 4, 9, 16}},                // 3-D k/v
      {{3, 4, 7, 16}, {3, 1, 9, 16}, {3, 1, 9, 12}, {3, 4, 9, 16}},          // one k/v head
      {{2, 2, 4, 7, 16}, {1, 2, 9, 16}, {2, 1, 2, 9, 12}, {4, 2, 9, 16}, true},  // 5-D + GQA
  };
  // float64 runs on MATH; the reduction to 4-D views is the same for every backend.
  for (const Shapes& s : cases) check(s, SDPBackend::MATH);
}

TEST(Broadcast, ShapesThatDoNotBroadcastNameTheArgument) {
  const Tensor q = randn({3, 4, 7, 16}, DType::kFloat32, 1);
  const Tensor k = randn({2, 4, 9, 16}, DType::kFloat32, 2);
  EXPECT_NE(error_message([&] { sdpa::scaled_dot_product_attention(q, k, k, {}); }).find("key"),
            std::string::npos);
  const Tensor big = randn({1, 3, 4, 9, 16}, DType::kFloat32, 3);
  EXPECT_NE(error_message([&] { sdpa::scaled_dot_product_attention(q, big, big, {}); })
                .find("key: expected 2 to 4 dimensions"),
            std::string::npos);
}

}  // namespace
}  // namespace sdpa_test
