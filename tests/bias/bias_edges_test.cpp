// Edge cases of the biases, on both backends: hand-written window patterns (W = 0,
// W >= S, left-only, right-only, top-left vs bottom-right), documents of length 1 and 0,
// all-padding batches, lower-right causal with L > S (zero rows, not NaN).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bias_reference.h"

namespace sdpa_test {
namespace {

using sdpa::AttnBiasPtr;
using sdpa::BlockDiagonalBias;
using sdpa::LocalAttentionBias;
using sdpa::PaddedKeysBias;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;
constexpr DiagonalAlignment kTopLeft = DiagonalAlignment::kTopLeft;
constexpr DiagonalAlignment kBottomRight = DiagonalAlignment::kBottomRight;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The keep pattern of `bias` on an L x S call, rows as strings of '1' (keep) / '.'.
std::vector<std::string> pattern(const sdpa::AttnBias& bias, int64_t L, int64_t S) {
  const Tensor m = bias.materialize({1, 1, L, S}, DType::kFloat32).expand({1, 1, L, S});
  std::vector<std::string> rows;
  for (int64_t i = 0; i < L; ++i) {
    std::string row;
    for (int64_t j = 0; j < S; ++j) {
      const double x = m.item({0, 0, i, j});
      const bool keep = m.dtype() == DType::kBool ? x != 0.0 : x != kNegInf;
      row += keep ? '1' : '.';
    }
    rows.push_back(row);
  }
  return rows;
}

using Rows = std::vector<std::string>;

TEST(BiasPatterns, CausalVariantsMatchPyTorch) {
  // torch.nn.attention.bias.causal_upper_left / causal_lower_right on 3 x 5 and 5 x 3.
  EXPECT_EQ(pattern(*sdpa::causal_upper_left(3, 5), 3, 5), (Rows{"1....", "11...", "111.."}));
  EXPECT_EQ(pattern(*sdpa::causal_lower_right(3, 5), 3, 5), (Rows{"111..", "1111.", "11111"}));
  EXPECT_EQ(pattern(*sdpa::causal_upper_left(5, 3), 5, 3),
            (Rows{"1..", "11.", "111", "111", "111"}));
  EXPECT_EQ(pattern(*sdpa::causal_lower_right(5, 3), 5, 3),
            (Rows{"...", "...", "1..", "11.", "111"}));
}

TEST(BiasPatterns, WindowEdges) {
  // FlashAttention window_size=(left, right), bottom-right: d = S - L.
  EXPECT_EQ(pattern(LocalAttentionBias(1, 0), 3, 5), (Rows{".11..", "..11.", "...11"}));
  EXPECT_EQ(pattern(LocalAttentionBias(1, 0, kTopLeft), 3, 5), (Rows{"1....", "11...", ".11.."}));
  // W = 0: the diagonal only; with L > S bottom-right the first rows see nothing.
  EXPECT_EQ(pattern(LocalAttentionBias(0, 0), 4, 4), (Rows{"1...", ".1..", "..1.", "...1"}));
  EXPECT_EQ(pattern(LocalAttentionBias(0, 0), 4, 2), (Rows{"..", "..", "1.", ".1"}));
  // W >= S: as wide as causal lower-right / no mask at all.
  EXPECT_EQ(pattern(LocalAttentionBias(9, 0), 3, 5),
            pattern(*sdpa::causal_lower_right(3, 5), 3, 5));
  EXPECT_EQ(pattern(LocalAttentionBias(9, 9), 3, 5), (Rows{"11111", "11111", "11111"}));
  // One-sided windows.
  EXPECT_EQ(pattern(LocalAttentionBias(1, std::nullopt), 3, 5), (Rows{".1111", "..111", "...11"}));
  EXPECT_EQ(pattern(LocalAttentionBias(std::nullopt, 1, kTopLeft), 3, 5),
            (Rows{"11...", "111..", "1111."}));
  EXPECT_EQ(pattern(LocalAttentionBias(std::nullopt, std::nullopt), 2, 3), (Rows{"111", "111"}));
}

TEST(BiasPatterns, DocumentsAndPadding) {
  // Queries {2, 1, 0, 1}, keys {1, 0, 2, 1}: document 1 has a query but no key, document 2
  // keys but no query.
  EXPECT_EQ(pattern(*BlockDiagonalBias::from_seqlens({2, 1, 0, 1}, {1, 0, 2, 1}), 4, 4),
            (Rows{"1...", "1...", "....", "...1"}));
  EXPECT_EQ(pattern(*BlockDiagonalBias::from_seqlens({3, 2}, {2, 3}, true), 5, 5),
            (Rows{"1....", "11...", "11...", "..1..", "..11."}));
  EXPECT_EQ(pattern(*BlockDiagonalBias::from_seqlens({3, 2}, {2, 3}, true, kBottomRight), 5, 5),
            (Rows{".....", "1....", "11...", "..11.", "..111"}));
  const Tensor padded = PaddedKeysBias({3, 0}, true).materialize({2, 1, 2, 4}, DType::kFloat32);
  ASSERT_EQ(padded.sizes(), (Shape{2, 1, 2, 4}));
  std::string b0, b1;
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      b0 += padded.item({0, 0, i, j}) != 0 ? '1' : '.';
      b1 += padded.item({1, 0, i, j}) != 0 ? '1' : '.';
    }
  }
  EXPECT_EQ(b0, "11..111.");  // causal aligned to the last valid key (j <= i + 3 - 2)
  EXPECT_EQ(b1, "........");
}

// ---- Both backends on edge cases. ----------------------------------------------------

class BiasEdges : public ::testing::TestWithParam<SDPBackend> {
 protected:
  // Runs the bias on GetParam() in float32 and checks it against MATH float64 on the
  // materialized tensor; returns the run.
  FwdBwd run_and_check(const AttnBiasPtr& bias, int64_t B, int64_t Hq, int64_t Hkv, int64_t L,
                       int64_t S, int64_t E = 16, int64_t Ev = 16) {
    const Tensor q = randn({B, Hq, L, E}, DType::kFloat32, 71);
    const Tensor k = randn({B, Hkv, S, E}, DType::kFloat32, 72);
    const Tensor v = randn({B, Hkv, S, Ev}, DType::kFloat32, 73);
    const Tensor go = randn({B, Hq, L, Ev}, DType::kFloat32, 74);
    SDPAOptions o;
    o.enable_gqa = Hq != Hkv;
    o.attn_mask = bias;
    SDPAOptions dense = o;
    dense.attn_mask = bias->materialize({B, Hq, L, S}, DType::kFloat64);
    const FwdBwd golden = run_fwd_bwd(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(go), dense);
    const FwdBwd naive = run_fwd_bwd(SDPBackend::MATH, q, k, v, go, o);
    const FwdBwd r = run_fwd_bwd(GetParam(), q, k, v, go, o);
    EXPECT_EQ(r.fwd.backend, GetParam());
    expect_matches_golden(r, golden, naive, DType::kFloat32);
    EXPECT_FALSE(has_nan(r.fwd.out) || has_nan(r.grads.grad_q) || has_nan(r.grads.grad_k) ||
                 has_nan(r.grads.grad_v));
    inputs_ = {q, k, v};
    return r;
  }
  std::vector<Tensor> inputs_;
};

TEST_P(BiasEdges, LowerRightCausalWithLongerQueriesGivesZeroRows) {
  const int64_t L = 130, S = 37;
  const FwdBwd r = run_and_check(sdpa::causal_lower_right(L, S), 2, 4, 2, L, S);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t i = 0; i < L; ++i) {
        const bool empty = i < L - S;  // query i sees j <= i + S - L
        EXPECT_EQ(all_zero(r.fwd.out.select(0, b).select(0, h).select(0, i)), empty) << i;
        EXPECT_EQ(r.fwd.lse.item({b, h, i}) == kNegInf, empty) << i;
        if (empty) {
          EXPECT_TRUE(all_zero(r.grads.grad_q.select(0, b).select(0, h).select(0, i)));
        }
      }
    }
  }
}

TEST_P(BiasEdges, WindowZeroCopiesTheDiagonalValue) {
  // W = 0 keeps exactly one key per row (j = i + S - L): out[i] = v[i + S - L].
  const int64_t L = 70, S = 90;
  const FwdBwd r = run_and_check(std::make_shared<LocalAttentionBias>(0, 0), 1, 2, 2, L, S);
  const Tensor& v = inputs_[2];
  for (int64_t i = 0; i < L; ++i) {
    EXPECT_TRUE(close_to("row", r.fwd.out.select(0, 0).select(0, 1).select(0, i),
                         v.select(0, 0).select(0, 1).select(0, i + S - L), DType::kFloat32));
  }
}

TEST_P(BiasEdges, WindowAtLeastSEqualsCausalAndUnbounded) {
  const int64_t L = 65, S = 130;
  const FwdBwd window = run_and_check(std::make_shared<LocalAttentionBias>(S, 0), 1, 2, 1, L, S);
  const FwdBwd causal = run_and_check(sdpa::causal_lower_right(L, S), 1, 2, 1, L, S);
  EXPECT_TRUE(close_to("window vs causal out", window.fwd.out, causal.fwd.out, DType::kFloat32));
  EXPECT_TRUE(close_to("window vs causal grad_k", window.grads.grad_k, causal.grads.grad_k,
                       DType::kFloat32));
  const FwdBwd wide =
      run_and_check(std::make_shared<LocalAttentionBias>(L + S, L + S), 1, 2, 1, L, S);
  const FwdBwd none = run_fwd_bwd(GetParam(), inputs_[0], inputs_[1], inputs_[2],
                                  randn({1, 2, L, 16}, DType::kFloat32, 74), [] {
                                    SDPAOptions o;
                                    o.enable_gqa = true;
                                    return o;
                                  }());
  EXPECT_TRUE(close_to("wide window vs no mask", wide.fwd.out, none.fwd.out, DType::kFloat32));
  EXPECT_TRUE(close_to("wide window vs no mask grad_q", wide.grads.grad_q, none.grads.grad_q,
                       DType::kFloat32));
  // Windows of INT64_MAX keys: the band's bounds saturate (they wrapped, masking every key).
  const int64_t huge = std::numeric_limits<int64_t>::max();
  const FwdBwd unbounded =
      run_and_check(std::make_shared<LocalAttentionBias>(huge, huge), 1, 2, 1, L, S);
  EXPECT_TRUE(close_to("INT64_MAX window vs no mask", unbounded.fwd.out, none.fwd.out,
                       DType::kFloat32));
  const FwdBwd huge_left =
      run_and_check(std::make_shared<LocalAttentionBias>(huge, 0), 1, 2, 1, L, S);
  EXPECT_TRUE(close_to("INT64_MAX left window vs causal", huge_left.fwd.out, causal.fwd.out,
                       DType::kFloat32));
}

TEST_P(BiasEdges, DocumentsOfLengthOneAttendToThemselves) {
  // Every document is one query and one key: out[i] = v[i], no gradient reaches q or k.
  const int64_t n = 67;
  const FwdBwd r =
      run_and_check(BlockDiagonalBias::from_seqlens(std::vector<int64_t>(n, 1)), 1, 2, 2, n, n);
  EXPECT_TRUE(close_to("out", r.fwd.out, inputs_[2], DType::kFloat32));
  EXPECT_LT(max_abs(r.grads.grad_q), 1e-5);
  EXPECT_LT(max_abs(r.grads.grad_k), 1e-5);
}

TEST_P(BiasEdges, EmptyDocumentsGiveZeroRowsAndZeroKeyGradients) {
  // q documents {5, 0, 70, 0, 1}, kv {0, 9, 66, 3, 1}: queries of document 0 have no keys
  // (zero rows), keys of documents 1 and 3 have no queries (zero grad_k / grad_v).
  const auto bias = BlockDiagonalBias::from_seqlens({5, 0, 70, 0, 1}, {0, 9, 66, 3, 1});
  const FwdBwd r = run_and_check(bias, 1, 4, 2, 76, 79);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(all_zero(r.fwd.out.select(2, i)));
    EXPECT_TRUE(all_zero(r.grads.grad_q.select(2, i)));
    EXPECT_EQ(r.fwd.lse.item({0, 0, i}), kNegInf);
  }
  for (int64_t j : {0, 1, 8, 75, 76, 77}) {
    EXPECT_TRUE(all_zero(r.grads.grad_k.select(2, j))) << j;
    EXPECT_TRUE(all_zero(r.grads.grad_v.select(2, j))) << j;
  }
  EXPECT_FALSE(all_zero(r.grads.grad_v.select(2, 78)));  // the last one-to-one document
}

TEST_P(BiasEdges, AllPaddingBatchGivesZerosAndMinusInfinity) {
  for (bool causal : {false, true}) {
    const auto bias = std::make_shared<PaddedKeysBias>(std::vector<int64_t>{0, 70, 0}, causal);
    const FwdBwd r = run_and_check(bias, 3, 2, 1, 33, 70);
    for (int64_t b : {0, 2}) {
      EXPECT_TRUE(all_zero(r.fwd.out.select(0, b))) << causal;
      for (double x : values(r.fwd.lse.select(0, b))) EXPECT_EQ(x, kNegInf);
      EXPECT_TRUE(all_zero(r.grads.grad_q.select(0, b)));
      EXPECT_TRUE(all_zero(r.grads.grad_k.select(0, b)));
      EXPECT_TRUE(all_zero(r.grads.grad_v.select(0, b)));
    }
    EXPECT_FALSE(all_zero(r.fwd.out.select(0, 1)));
  }
}

TEST_P(BiasEdges, PaddingComposedWithDocumentsAndAlibi) {
  const int64_t L = 65, S = 65;
  const auto bias = sdpa::compose({std::make_shared<PaddedKeysBias>(std::vector<int64_t>{40, 0}),
                                   BlockDiagonalBias::from_seqlens({30, 35}, {}, true),
                                   std::make_shared<sdpa::AlibiBias>(4)});
  const FwdBwd r = run_and_check(bias, 2, 4, 2, L, S);
  EXPECT_TRUE(all_zero(r.fwd.out.select(0, 1)));
  // Batch 0, second document: queries 30..64 see keys 30..39 only (causal inside the
  // document, padding at 40): query 30 + t sees keys 30..min(30 + t, 39).
  EXPECT_FALSE(all_zero(r.fwd.out.select(0, 0).select(1, 64)));
}

INSTANTIATE_TEST_SUITE_P(Backends, BiasEdges,
                         ::testing::Values(SDPBackend::MATH, SDPBackend::FLASH_ATTENTION),
                         [](const ::testing::TestParamInfo<SDPBackend>& info) {
                           return std::string(sdpa::backend_name(info.param));
                         });

// A float16 call whose ALiBi terms all exceed float16's range on the first rows (more
// queries than keys, bottom-right: rows i < 31 are at distance >= 1 from every key, and
// the slope is 1e5). FLASH adds them in float32; MATH, which sees the bias materialized,
// must too: materialized in float16 they were -inf, and those rows came out fully masked.
TEST(BiasPrecision, HalfPrecisionMathAddsBiasesInFloat32LikeFlash) {
  const Tensor q = randn({1, 2, 64, 16}, DType::kFloat16, 1, 0.05);
  const Tensor k = randn({1, 2, 33, 16}, DType::kFloat16, 2, 0.05);
  const Tensor v = randn({1, 2, 33, 16}, DType::kFloat16, 3);
  SDPAOptions o;
  o.attn_mask = std::make_shared<sdpa::AlibiBias>(std::vector<float>{1e5f, 1e-4f});
  const Tensor grad_out = randn({1, 2, 64, 16}, DType::kFloat16, 4);
  const FwdBwd flash = run_fwd_bwd(SDPBackend::FLASH_ATTENTION, q, k, v, grad_out, o);
  const FwdBwd math = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, o);
  EXPECT_FALSE(has_nan(math.fwd.lse));
  EXPECT_TRUE(std::isfinite(math.fwd.lse.item({0, 0, 0}))) << math.fwd.lse.item({0, 0, 0});
  EXPECT_TRUE(close_to("lse", math.fwd.lse, flash.fwd.lse, DType::kFloat32));
  EXPECT_TRUE(close_to("out", math.fwd.out, flash.fwd.out, DType::kFloat16));
  EXPECT_TRUE(close_to("grad_v", math.grads.grad_v, flash.grads.grad_v, DType::kFloat16));
}

}  // namespace
}  // namespace sdpa_test
