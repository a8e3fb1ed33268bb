// make_params: the normalized AttentionParams every check and kernel reads (sizes, 4-D
// views, default scale, mask descriptor, dropout state, flags).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "sdpa/sdpa.h"

namespace sdpa {
namespace {

struct Qkv {
  Tensor q, k, v;
};
Qkv make(const Shape& q, const Shape& k, const Shape& v, DType dtype = DType::kFloat32) {
  return {Tensor::full(q, 0.5, dtype), Tensor::full(k, 0.25, dtype), Tensor::full(v, 1, dtype)};
}

TEST(MakeParams, SizesViewsAndDefaultScale) {
  const Qkv t = make({2, 8, 7, 80}, {2, 2, 9, 80}, {2, 2, 9, 24}, DType::kBFloat16);
  SDPAOptions o;
  o.enable_gqa = true;
  const AttentionParams p = make_params(t.q, t.k, t.v, o);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.num_heads_q, 8);
  EXPECT_EQ(p.num_heads_kv, 2);
  EXPECT_EQ(p.group_size(), 4);
  EXPECT_EQ(p.q_len, 7);
  EXPECT_EQ(p.kv_len, 9);
  EXPECT_EQ(p.head_dim_qk, 80);
  EXPECT_EQ(p.head_dim_vo, 24);
  EXPECT_EQ(p.dtype, DType::kBFloat16);
  EXPECT_EQ(p.device, Device{});
  EXPECT_DOUBLE_EQ(p.scale, 1.0 / std::sqrt(80.0));
  EXPECT_TRUE(p.enable_gqa);
  EXPECT_FALSE(p.unbatched);
  EXPECT_FALSE(p.has_dropout());
  EXPECT_TRUE(p.mask.empty());
  // Views of the caller's memory, not copies.
  EXPECT_EQ(p.q.data_ptr(), t.q.data_ptr());
  EXPECT_EQ(p.k.data_ptr(), t.k.data_ptr());
  EXPECT_EQ(p.v.data_ptr(), t.v.data_ptr());
}

TEST(MakeParams, UnbatchedInputsBecomeFourDimensionalViews) {
  const Qkv t = make({4, 7, 16}, {4, 9, 16}, {4, 9, 16});
  const AttentionParams p = make_params(t.q, t.k, t.v);
  EXPECT_TRUE(p.unbatched);
  EXPECT_EQ(p.batch, 1);
  EXPECT_EQ(p.q.dim(), 4);
  EXPECT_EQ(p.q.sizes(), (Shape{1, 4, 7, 16}));
  EXPECT_EQ(p.q.data_ptr(), t.q.data_ptr());
}

TEST(MakeParams, ExplicitScale) {
  const Qkv t = make({1, 1, 3, 16}, {1, 1, 4, 16}, {1, 1, 4, 16});
  SDPAOptions o;
  o.scale = -0.125;
  EXPECT_EQ(make_params(t.q, t.k, t.v, o).scale, -0.125);
}

TEST(MakeParams, MasksBecomeNativeDescriptors) {
  const Qkv t = make({2, 3, 7, 16}, {2, 3, 9, 16}, {2, 3, 9, 16});
  SDPAOptions o;
  o.is_causal = true;
  AttentionParams p = make_params(t.q, t.k, t.v, o);
  ASSERT_EQ(p.mask.bands.size(), 1u);
  EXPECT_EQ(p.mask.bands[0].alignment, DiagonalAlignment::kTopLeft);
  EXPECT_EQ(p.mask.bands[0].right, std::optional<int64_t>(0));
  EXPECT_FALSE(p.mask.bands[0].left.has_value());
  EXPECT_EQ(p.mask.dense_kind, DenseMaskKind::kNone);

  o = {};
  o.attn_mask = Tensor::full({9}, 1, DType::kBool);
  p = make_params(t.q, t.k, t.v, o);
  EXPECT_EQ(p.mask.dense_kind, DenseMaskKind::kBoolKeep);
  EXPECT_EQ(p.mask.dense.sizes(), (Shape{2, 3, 7, 9}));  // broadcast view, not a copy
  EXPECT_EQ(p.mask.dense.stride(0), 0);
  EXPECT_EQ(p.mask.dense.stride(2), 0);
  EXPECT_TRUE(p.mask.bands.empty());

  o.attn_mask = Tensor::zeros({2, 1, 7, 9}, DType::kFloat32);
  p = make_params(t.q, t.k, t.v, o);
  EXPECT_EQ(p.mask.dense_kind, DenseMaskKind::kAdditive);
  EXPECT_EQ(p.mask.dense.sizes(), (Shape{2, 3, 7, 9}));
  EXPECT_EQ(p.mask.dense.stride(1), 0);
}

TEST(MakeParams, DropoutStateComesFromTheGeneratorOrTheReplayState) {
  const Qkv t = make({1, 1, 3, 16}, {1, 1, 4, 16}, {1, 1, 4, 16});
  Generator gen(55);
  gen.next();  // offset 1 next
  SDPAOptions o;
  o.dropout_p = 0.25;
  o.generator = &gen;
  AttentionParams p = make_params(t.q, t.k, t.v, o);
  EXPECT_TRUE(p.has_dropout());
  EXPECT_EQ(p.dropout.p, 0.25);
  EXPECT_EQ(p.dropout.philox.seed, 55u);
  EXPECT_EQ(p.dropout.philox.offset, 1u);
  o.dropout_state = PhiloxState{9, 99};
  p = make_params(t.q, t.k, t.v, o);
  EXPECT_EQ(p.dropout.philox.seed, 9u);
  EXPECT_EQ(p.dropout.philox.offset, 99u);
  EXPECT_EQ(gen.next().offset, 2u) << "a replay state must not draw from the generator";
}

TEST(MakeParams, DeterministicFlagIsRecorded) {
  const Qkv t = make({1, 1, 3, 16}, {1, 1, 4, 16}, {1, 1, 4, 16});
  EXPECT_FALSE(are_deterministic_algorithms_enabled());
  use_deterministic_algorithms(true);
  EXPECT_TRUE(are_deterministic_algorithms_enabled());
  EXPECT_TRUE(make_params(t.q, t.k, t.v).deterministic);
  use_deterministic_algorithms(false);
  EXPECT_FALSE(make_params(t.q, t.k, t.v).deterministic);
}

}  // namespace
}  // namespace sdpa
