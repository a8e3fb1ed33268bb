// Masks on every backend against the float64 reference: bool (true = keep) and additive
// float masks, broadcast shapes, causal with L != S, fully masked rows (out 0, lse -inf)
// and the empty shapes L = 0 / S = 0.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "common/harness.h"

namespace sdpa::test {
namespace {

void expect_cpu_backends_ran(const Case& c, const CaseReport& r) {
  EXPECT_TRUE(r.ran_backend(SDPBackend::MATH)) << "MATH did not run " << c.describe();
  EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION))
      << "FLASH_ATTENTION did not run " << c.describe() << ": "
      << (r.not_supported.count(SDPBackend::FLASH_ATTENTION)
              ? r.not_supported.at(SDPBackend::FLASH_ATTENTION)
              : std::string("?"));
}

Case base_case() {
  Case c;
  c.batch = 2;
  c.heads_q = c.heads_kv = 3;
  c.q_len = 65;
  c.kv_len = 63;
  c.head_dim = 64;
  return c;
}

// ---- dense masks, full and broadcast ------------------------------------------------

class MaskShapes : public ::testing::TestWithParam<MaskKind> {};

TEST_P(MaskShapes, FullAndBroadcastShapesMatchReference) {
  const Shape shapes[] = {
      {},              // [B, Hq, L, S]
      {65, 63},        // [L, S]
      {2, 1, 65, 63},  // [B, 1, L, S]
      {2, 1, 1, 63},   // [B, 1, 1, S]: key padding
      {1, 3, 1, 63},   // [1, Hq, 1, S]
      {63},            // [S]
      {3, 65, 1},      // [Hq, L, 1]
      {1, 1, 1, 1},
  };
  SweepTally tally;
  for (const Shape& shape : shapes) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
      Case c = base_case();
      c.mask = GetParam();
      c.mask_shape = shape;
      c.dtype = dtype;
      c.seed = static_cast<uint32_t>(shape.size() * 17 + static_cast<int>(dtype));
      const CaseReport r = check_case(c);
      expect_cpu_backends_ran(c, r);
      tally.add(r);
    }
  }
  tally.print(GetParam() == MaskKind::kBool ? "bool masks" : "float masks");
}

INSTANTIATE_TEST_SUITE_P(Kinds, MaskShapes, ::testing::Values(MaskKind::kBool, MaskKind::kFloat),
                         [](const auto& info) {
                           return info.param == MaskKind::kBool ? "Bool" : "Float";
                         });

// A mask over odd sizes that straddle the kernels' tile edges, with GQA.
TEST(Masks, OddSizesWithGroupedQuery) {
  for (MaskKind mask : {MaskKind::kBool, MaskKind::kFloat}) {
    for (const auto& [l, s] : {std::pair<int64_t, int64_t>{1, 1000}, {257, 7}, {1000, 65}}) {
      Case c;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.enable_gqa = true;
      c.q_len = l;
      c.kv_len = s;
      c.head_dim = 24;
      c.mask = mask;
      c.mask_shape = {1, 4, l, s};
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

// Masks that empty whole kv tiles (the flash kernel works in 64-key tiles): the first tile,
// a middle one, the last partial one, or all but one key of the last tile. The online
// softmax starts from -inf and must not produce NaN from exp(-inf - -inf).
TEST(Masks, WholeKeyTilesMasked) {
  const int64_t L = 70, S = 200;
  struct Pattern {
    const char* name;
    std::function<bool(int64_t, int64_t)> keep;  // (i, j) -> takes part
  };
  const Pattern patterns[] = {
      {"first tile masked", [](int64_t, int64_t j) { return j >= 64; }},
      {"middle tile masked", [](int64_t, int64_t j) { return j < 64 || j >= 128; }},
      {"last partial tile masked", [](int64_t, int64_t j) { return j < 192; }},
      {"only the last key", [&](int64_t, int64_t j) { return j == S - 1; }},
      {"only one key per row, moving", [](int64_t i, int64_t j) { return j == (i * 37) % 200; }},
      {"rows alternately empty", [](int64_t i, int64_t j) { return i % 2 == 0 && j > 150; }},
  };
  for (const Pattern& pattern : patterns) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (bool additive : {false, true}) {
        std::mt19937 rng(21);
        const Tensor q = random_tensor({1, 2, L, 64}, dtype, Layout::kBHSD, rng);
        const Tensor k = random_tensor({1, 2, S, 64}, dtype, Layout::kBHSD, rng);
        const Tensor v = random_tensor({1, 2, S, 32}, dtype, Layout::kBHSD, rng);
        Tensor mask = Tensor::empty({L, S}, additive ? dtype : DType::kBool);
        std::vector<double> values(static_cast<size_t>(L * S));
        for (int64_t i = 0; i < L; ++i) {
          for (int64_t j = 0; j < S; ++j) {
            const bool keep = pattern.keep(i, j);
            values[i * S + j] = additive ? (keep ? 0.5 : -std::numeric_limits<double>::infinity())
                                         : (keep ? 1.0 : 0.0);
          }
        }
        fill_from_doubles(mask, values);
        CaseInputs in;
        in.q = q;
        in.k = k;
        in.v = v;
        in.mask = mask;
        in.options.attn_mask = mask;
        ReferenceOptions ro;
        ro.mask = mask;
        in.ref = reference_attention(q, k, v, ro);
        const std::string what = std::string(pattern.name) + (additive ? " additive " : " bool ") +
                                 std::string(dtype_name(dtype));
        expect_cpu_backends_ran(Case{}, check_inputs(in, dtype, false, what));
      }
    }
  }
}

// ---- causal with L != S -------------------------------------------------------------

TEST(Causal, TopLeftWithQueryShorterAndLongerThanKeys) {
  const std::pair<int64_t, int64_t> lengths[] = {{7, 63},   {63, 7},     {1, 1000},
                                                 {1000, 1}, {257, 1000}, {1000, 257}};
  for (const auto& [l, s] : lengths) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      Case c;
      c.heads_q = 2;
      c.heads_kv = 2;
      c.q_len = l;
      c.kv_len = s;
      c.head_dim = 64;
      c.dtype = dtype;
      c.causal = true;
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

// ---- infinite inputs ----------------------------------------------------------------

// A key with an infinite element scores -inf for the queries whose matching element is
// negative: the fused kernels drop that key like a masked one (on full, unmasked tiles
// too). Compared with the same call masking the key (its infinite element made finite).
TEST(InfiniteInputs, MinusInfScoreDropsOutLikeAMaskedKey) {
  const sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::mt19937 rng(11);
    const int64_t L = 128, S = 128, E = 64, key = 3, element = 5;
    Tensor q = random_tensor({1, 2, L, E}, DType::kFloat32, Layout::kBHSD, rng);
    Tensor k = random_tensor({1, 2, S, E}, DType::kFloat32, Layout::kBHSD, rng);
    const Tensor v = random_tensor({1, 2, S, E}, DType::kFloat32, Layout::kBHSD, rng);
    for (int64_t i = 0; i < 2 * L; ++i) {
      float& x = q.data<float>()[i * E + element];
      x = -std::fabs(x) - 0.125f;
    }
    Tensor keep = Tensor::full({S}, 1.0, DType::kBool);
    keep.data<bool>()[key] = false;
    SDPAOptions masked;
    masked.attn_mask = keep;
    const Tensor want = scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), masked)
                            .to(DType::kFloat32);
    for (int64_t h = 0; h < 2; ++h) {
      k.data<float>()[(h * S + key) * E + element] = std::numeric_limits<float>::infinity();
    }
    const Tensor got =
        scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype)).to(DType::kFloat32);
    // The two calls scale the scores at different steps (masked tiles before the softmax).
    const float* g = got.data<float>();
    const float* w = want.data<float>();
    float largest = 0.0f;
    for (int64_t i = 0; i < want.numel(); ++i) largest = std::max(largest, std::fabs(w[i]));
    for (int64_t i = 0; i < got.numel(); ++i) {
      ASSERT_NEAR(g[i], w[i], tolerance_for(dtype).out_rel * largest)
          << dtype_name(dtype) << " element " << i;
    }
  }
}

// ---- fully masked rows --------------------------------------------------------------

TEST(FullyMaskedRows, BoolMaskAllFalseRowsGiveZeroAndMinusInfLse) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
    Case c = base_case();
    c.mask = MaskKind::kBool;
    c.mask_shape = {2, 3, 65, 63};
    c.masked_rows = {0, 1, 17, 31, 32, 63, 64};
    c.dtype = dtype;
    expect_cpu_backends_ran(c, check_case(c));
  }
}

TEST(FullyMaskedRows, FloatMaskMinusInfRowsGiveZeroAndMinusInfLse) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
    Case c = base_case();
    c.mask = MaskKind::kFloat;
    c.mask_shape = {65, 63};
    c.masked_rows = {0, 5, 64};
    c.dtype = dtype;
    expect_cpu_backends_ran(c, check_case(c));
  }
}

// A whole tile of rows (and every row) masked out.
TEST(FullyMaskedRows, EveryRowMasked) {
  for (MaskKind kind : {MaskKind::kBool, MaskKind::kFloat}) {
    Case c = base_case();
    c.q_len = 40;
    c.kv_len = 300;
    c.mask = kind;
    c.mask_shape = {1, 1, 40, 300};
    for (int64_t i = 0; i < 40; ++i) c.masked_rows.push_back(i);
    expect_cpu_backends_ran(c, check_case(c));
  }
}

// Masked rows in a call with GQA and an unbatched 3-D call.
TEST(FullyMaskedRows, WithGroupedQueryAndUnbatched) {
  Case c;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.enable_gqa = true;
  c.q_len = 33;
  c.kv_len = 17;
  c.mask = MaskKind::kBool;
  c.mask_shape = {33, 17};
  c.masked_rows = {3, 32};
  expect_cpu_backends_ran(c, check_case(c));
  c.unbatched = true;
  c.mask = MaskKind::kFloat;
  expect_cpu_backends_ran(c, check_case(c));
}

// ---- empty shapes -------------------------------------------------------------------

// S = 0: every row is fully masked: out is zeros, lse is -inf.
TEST(EmptyShapes, ZeroKeysGiveZerosAndMinusInf) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 2;
      c.heads_q = c.heads_kv = 2;
      c.q_len = 7;
      c.kv_len = 0;
      c.head_dim = 24;
      c.head_dim_v = 8;
      c.dtype = dtype;
      c.causal = causal;
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

TEST(EmptyShapes, ZeroKeysWithMask) {
  Case c;
  c.heads_q = c.heads_kv = 2;
  c.q_len = 5;
  c.kv_len = 0;
  c.mask = MaskKind::kBool;
  c.mask_shape = {5, 0};
  expect_cpu_backends_ran(c, check_case(c));
}

TEST(EmptyShapes, ZeroQueriesGiveEmptyOutputs) {
  for (int64_t s : {0, 9}) {
    for (bool causal : {false, true}) {
      Case c;
      c.batch = 2;
      c.heads_q = c.heads_kv = 2;
      c.q_len = 0;
      c.kv_len = s;
      c.head_dim = 24;
      c.head_dim_v = 16;
      c.causal = causal;
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

TEST(EmptyShapes, ZeroBatchAndUnbatchedZeroLength) {
  Case c;
  c.batch = 0;
  c.heads_q = c.heads_kv = 2;
  c.q_len = 3;
  c.kv_len = 4;
  expect_cpu_backends_ran(c, check_case(c));
  Case u;
  u.unbatched = true;
  u.heads_q = u.heads_kv = 2;
  u.q_len = 3;
  u.kv_len = 0;
  expect_cpu_backends_ran(u, check_case(u));
}

// A float mask with very negative (finite) entries is not "fully masked": the row is a
// proper softmax over those entries.
TEST(Masks, VeryNegativeFiniteFloatMaskIsNotMasking) {
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    std::mt19937 rng(9);
    const Tensor q = random_tensor({1, 1, 3, 8}, DType::kFloat32, Layout::kBHSD, rng);
    const Tensor k = random_tensor({1, 1, 5, 8}, DType::kFloat32, Layout::kBHSD, rng);
    const Tensor v = random_tensor({1, 1, 5, 8}, DType::kFloat32, Layout::kBHSD, rng);
    const Tensor mask = Tensor::full({3, 5}, -1e30, DType::kFloat32);
    SDPAOptions o;
    o.attn_mask = mask;
    ReferenceOptions ro;
    ro.mask = mask;
    const ReferenceResult ref = reference_attention(q, k, v, ro);
    sdpa_kernel guard(b);
    const AttentionResult r = scaled_dot_product_attention_with_lse(q, k, v, o);
    EXPECT_TRUE(matches_reference(r.out, r.lse, ref, DType::kFloat32, false)) << backend_name(b);
    for (double x : to_doubles(r.lse)) EXPECT_TRUE(std::isfinite(x)) << backend_name(b);
  }
}

}  // namespace
}  // namespace sdpa::test
