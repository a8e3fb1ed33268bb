// attention_varlen with dropout (flash_attn_varlen_func's dropout_p): the mask is the one
// the packed call draws, i.e. scaled_dot_product_attention on the packed [1, H, total, E]
// tensors under a BlockDiagonalBias with the same state, here in float64 on MATH (which
// draws exactly the CPU kernels' elements); the backward replays it. Ragged lengths with
// sequences without queries or keys, GQA, Ev != E, with and without softcap; one
// generator draw per call; the paths that take no dropout refuse it by name.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sdpa/attn_bias.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"
#include "sdpa/kv_cache.h"
#include "sdpa/varlen.h"
#include "serving_util.h"

namespace sdpa {
namespace {

using serving_test::int32s;
using serving_test::max_abs_diff;
using serving_test::randn;
using ::testing::HasSubstr;

std::vector<int64_t> cumulative(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu{0};
  for (int64_t n : lengths) cu.push_back(cu.back() + n);
  return cu;
}

Tensor int32_offsets(const std::vector<int64_t>& cu) {
  return int32s(std::vector<int32_t>(cu.begin(), cu.end()));
}

// [total, H, D] as the packed call's [1, H, total, D].
Tensor packed(const Tensor& t) { return t.transpose(0, 1).unsqueeze(0); }

struct Inputs {
  std::vector<int64_t> cu_q, cu_k;
  Tensor q, k, v, grad_out;
  int64_t max_q = 0, max_k = 0;
};

// Lengths 0 ... 130 with a sequence without queries or keys, one with queries but no
// keys and one with keys but no queries; Hq = 4, Hkv = 2, E = 24, Ev = 20.
Inputs ragged(DType dtype) {
  const std::vector<int64_t> lq = {1, 7, 0, 65, 3, 130, 0}, lk = {5, 7, 0, 65, 0, 90, 9};
  Inputs in;
  in.cu_q = cumulative(lq);
  in.cu_k = cumulative(lk);
  in.max_q = *std::max_element(lq.begin(), lq.end());
  in.max_k = *std::max_element(lk.begin(), lk.end());
  in.q = randn({in.cu_q.back(), 4, 24}, 1, dtype);
  in.k = randn({in.cu_k.back(), 2, 24}, 2, dtype);
  in.v = randn({in.cu_k.back(), 2, 20}, 3, dtype);
  in.grad_out = randn({in.cu_q.back(), 4, 20}, 4, dtype);
  return in;
}

AttentionResult varlen(const Inputs& in, const SequenceOptions& o) {
  return attention_varlen(in.q, in.k, in.v, int32_offsets(in.cu_q), int32_offsets(in.cu_k),
                          in.max_q, in.max_k, o);
}

TEST(VarlenDropout, IsThePackedCallsMaskForwardAndBackward) {
  const Inputs in = ragged(DType::kFloat32);
  SequenceOptions o;
  o.dropout_p = 0.3;
  o.dropout_state = PhiloxState{1234, 5};
  const AttentionResult r = varlen(in, o);
  EXPECT_EQ(r.philox.seed, 1234u);
  EXPECT_EQ(r.philox.offset, 5u);
  const AttentionGradients g =
      attention_varlen_backward(in.grad_out, in.q, in.k, in.v, r.out, r.lse, int32_offsets(in.cu_q),
                                int32_offsets(in.cu_k), in.max_q, in.max_k, o);

  SDPAOptions packed_options;
  packed_options.enable_gqa = true;
  packed_options.attn_mask = std::make_shared<BlockDiagonalBias>(in.cu_q, in.cu_k);
  packed_options.dropout_p = 0.3;
  packed_options.dropout_state = PhiloxState{1234, 5};
  const auto f64 = [](const Tensor& t) { return packed(t).to(DType::kFloat64); };
  sdpa_kernel math(SDPBackend::MATH);
  const AttentionResult want =
      scaled_dot_product_attention_with_lse(f64(in.q), f64(in.k), f64(in.v), packed_options);
  EXPECT_LE(max_abs_diff(packed(r.out), want.out), 2e-5);
  EXPECT_LE(max_abs_diff(r.lse.unsqueeze(0), want.lse), 2e-5);
  const AttentionGradients want_g = scaled_dot_product_attention_backward(
      f64(in.grad_out), f64(in.q), f64(in.k), f64(in.v), want.out, want.lse, packed_options);
  EXPECT_LE(max_abs_diff(packed(g.grad_q), want_g.grad_q), 1e-4);
  EXPECT_LE(max_abs_diff(packed(g.grad_k), want_g.grad_k), 1e-4);
  EXPECT_LE(max_abs_diff(packed(g.grad_v), want_g.grad_v), 1e-4);

  // The mask matters: without dropout the outputs differ.
  EXPECT_GT(max_abs_diff(varlen(in, {}).out, r.out), 0.1);
}

// With softcap (a flex score_mod per sequence) the weights dropped are still the packed
// call's: flex_attention over the packed tensors with the same cap, documents and state.
TEST(VarlenDropout, WithSoftcapIsThePackedFlexCallsMask) {
  const Inputs in = ragged(DType::kFloat32);
  SequenceOptions o;
  o.dropout_p = 0.25;
  o.dropout_state = PhiloxState{99, 3};
  o.softcap = 1.5;
  o.causal = true;
  const AttentionResult r = varlen(in, o);
  const AttentionGradients g =
      attention_varlen_backward(in.grad_out, in.q, in.k, in.v, r.out, r.lse, int32_offsets(in.cu_q),
                                int32_offsets(in.cu_k), in.max_q, in.max_k, o);

  SDPAOptions packed_options;
  packed_options.enable_gqa = true;
  packed_options.attn_mask = std::make_shared<BlockDiagonalBias>(
      in.cu_q, in.cu_k, true, DiagonalAlignment::kBottomRight);
  packed_options.dropout_p = 0.25;
  packed_options.dropout_state = PhiloxState{99, 3};
  const flex::Program cap = flex::Program::from_score_mod(flex::mods::soft_cap(1.5));
  const auto f64 = [](const Tensor& t) { return packed(t).to(DType::kFloat64); };
  sdpa_kernel math(SDPBackend::MATH);
  const AttentionResult want =
      flex_attention(f64(in.q), f64(in.k), f64(in.v), cap, nullptr, packed_options);
  EXPECT_LE(max_abs_diff(packed(r.out), want.out), 2e-5);
  EXPECT_LE(max_abs_diff(r.lse.unsqueeze(0), want.lse), 2e-5);
  const AttentionGradients want_g =
      flex_attention_backward(f64(in.grad_out), f64(in.q), f64(in.k), f64(in.v), want.out,
                              want.lse, cap, nullptr, packed_options);
  EXPECT_LE(max_abs_diff(packed(g.grad_q), want_g.grad_q), 1e-4);
  EXPECT_LE(max_abs_diff(packed(g.grad_k), want_g.grad_k), 1e-4);
  EXPECT_LE(max_abs_diff(packed(g.grad_v), want_g.grad_v), 1e-4);

  // Both act: without dropout, or without the cap, the outputs differ.
  SequenceOptions no_dropout = o;
  no_dropout.dropout_p = 0.0;
  EXPECT_GT(max_abs_diff(varlen(in, no_dropout).out, r.out), 0.1);
  SequenceOptions no_cap = o;
  no_cap.softcap = 0.0;
  EXPECT_GT(max_abs_diff(varlen(in, no_cap).out, r.out), 0.01);
}

TEST(VarlenDropout, DrawsOnceFromTheGeneratorAndReplays) {
  const Inputs in = ragged(DType::kBFloat16);
  Generator gen(77);
  SequenceOptions o;
  o.dropout_p = 0.5;
  o.generator = &gen;
  const AttentionResult first = varlen(in, o);
  EXPECT_EQ(first.philox.seed, 77u);
  EXPECT_EQ(first.philox.offset, 0u);
  EXPECT_EQ(gen.next().offset, 1u);  // one draw for the whole call
  SequenceOptions replay = o;
  replay.dropout_state = first.philox;
  EXPECT_EQ(max_abs_diff(varlen(in, replay).out, first.out), 0.0);
  replay.dropout_state = PhiloxState{77, 9};
  EXPECT_GT(max_abs_diff(varlen(in, replay).out, first.out), 0.1);
}

TEST(VarlenDropout, RefusedWhereItHasNoMeaning) {
  const Inputs in = ragged(DType::kFloat32);
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  SequenceOptions o;
  o.dropout_p = 0.2;
  const AttentionResult r = varlen(in, o);
  EXPECT_THAT(message([&] {
                (void)attention_varlen_backward(in.grad_out, in.q, in.k, in.v, r.out, r.lse,
                                                int32_offsets(in.cu_q), int32_offsets(in.cu_k),
                                                in.max_q, in.max_k, o);
              }),
              HasSubstr("dropout_state: a backward with dropout_p 0.2 needs the forward's"));
  SequenceOptions bad = o;
  bad.dropout_p = 1.5;
  EXPECT_THAT(message([&] { (void)varlen(in, bad); }),
              HasSubstr("dropout_p: expected a probability in [0, 1], got 1.5"));
  const Tensor pool = randn({4, 16, 2, 24}, 5), table = int32s({0, 1, 2, 3, 0, 1, 2}, {7, 1});
  EXPECT_THAT(message([&] {
                (void)attention_varlen_paged(in.q, pool, pool.slice(3, 0, 20),
                                             int32_offsets(in.cu_q), int32_offsets(in.cu_k), table,
                                             in.max_q, in.max_k, o);
              }),
              HasSubstr("dropout_p: the paged varlen path is inference"));
  KvCacheOptions cache_options;
  cache_options.dropout_p = 0.2;
  const Tensor cache = randn({1, 8, 2, 24}, 6);
  EXPECT_THAT(message([&] {
                (void)attention_with_kvcache(randn({1, 1, 4, 24}, 7), cache, cache, int32s({8}),
                                             cache_options);
              }),
              HasSubstr("dropout_p: attention_with_kvcache is inference"));
}

}  // namespace
}  // namespace sdpa
