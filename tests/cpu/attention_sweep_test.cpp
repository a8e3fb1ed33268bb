// Every backend against the float64 reference (tests/common) over the shapes, dtypes,
// layouts, GQA and batch sizes of issue 2 section 9. A backend that reports "not
// supported" is counted, not failed; MATH and FLASH_ATTENTION must both run every
// float32 / half case on CPU, and MATH every float64 case.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/harness.h"
#include "common/threads.h"

namespace sdpa::test {
namespace {


constexpr int64_t kLengths[] = {1, 7, 63, 65, 257, 1000};

// "prefix<n>suffix" (built by appending: GCC 12 warns falsely on operator+ here).
std::string param_name(const char* prefix, int64_t n, const char* suffix = "") {
  std::string s = prefix;
  s += std::to_string(n);
  s += suffix;
  return s;
}

// Checks that the CPU backends every case must run did run.
void expect_cpu_backends_ran(const Case& c, const CaseReport& r) {
  EXPECT_TRUE(r.ran_backend(SDPBackend::MATH)) << "MATH did not run " << c.describe();
  EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION))
      << "FLASH_ATTENTION did not run " << c.describe() << ": "
      << (r.not_supported.count(SDPBackend::FLASH_ATTENTION)
              ? r.not_supported.at(SDPBackend::FLASH_ATTENTION)
              : std::string("?"));
}

// ---- L x S: all 36 pairs at E = 64, without mask and causal, in every dtype ------------

class LengthSweep : public ::testing::TestWithParam<std::tuple<DType, int64_t, bool>> {};

TEST_P(LengthSweep, EveryKvLengthMatchesReference) {
  const auto [dtype, q_len, causal] = GetParam();
  SweepTally tally;
  for (int64_t kv_len : kLengths) {
    Case c;
    c.heads_q = c.heads_kv = 2;
    c.q_len = q_len;
    c.kv_len = kv_len;
    c.head_dim = 64;
    c.dtype = dtype;
    c.causal = causal;
    c.seed = static_cast<uint32_t>(q_len * 1009 + kv_len);
    const CaseReport r = check_case(c);
    expect_cpu_backends_ran(c, r);
    tally.add(r);
  }
  tally.print(std::string(dtype_name(dtype)) + param_name(" L=", q_len, causal ? " causal" : ""));
}

INSTANTIATE_TEST_SUITE_P(
    AllPairs, LengthSweep,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                         DType::kFloat64),
                       ::testing::ValuesIn(kLengths), ::testing::Bool()),
    [](const auto& info) {
      std::string name(dtype_name(std::get<0>(info.param)));
      name += param_name("_L", std::get<1>(info.param),
                         std::get<2>(info.param) ? "_causal" : "_nomask");
      return name;
    });

// ---- head dims ---------------------------------------------------------------------

class HeadDimSweep : public ::testing::TestWithParam<int64_t> {};

TEST_P(HeadDimSweep, MatchesReferenceAtSeveralLengths) {
  const int64_t e = GetParam();
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1}, {7, 63}, {65, 257}, {257, 65}};
  SweepTally tally;
  for (const auto& [l, s] : lengths) {
    for (bool causal : {false, true}) {
      Case c;
      c.heads_q = c.heads_kv = 2;
      c.q_len = l;
      c.kv_len = s;
      c.head_dim = e;
      c.causal = causal;
      c.seed = static_cast<uint32_t>(e * 31 + l + s);
      const CaseReport r = check_case(c);
      expect_cpu_backends_ran(c, r);
      tally.add(r);
    }
  }
  tally.print(param_name("E=", e));
}

INSTANTIATE_TEST_SUITE_P(E, HeadDimSweep, ::testing::Values(8, 24, 64, 80, 128, 256),
                         [](const auto& info) { return param_name("E", info.param); });

// ---- Ev != E ------------------------------------------------------------------------

TEST(ValueHeadDim, DiffersFromQueryKeyHeadDim) {
  const std::pair<int64_t, int64_t> dims[] = {{64, 24}, {24, 80}, {8, 256}, {256, 8}, {80, 64}};
  for (const auto& [e, ev] : dims) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
      Case c;
      c.heads_q = c.heads_kv = 2;
      c.q_len = 33;
      c.kv_len = 65;
      c.head_dim = e;
      c.head_dim_v = ev;
      c.dtype = dtype;
      c.causal = e < ev;
      c.seed = static_cast<uint32_t>(e * 7 + ev);
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

// ---- dtypes -------------------------------------------------------------------------

class DtypeSweep : public ::testing::TestWithParam<DType> {};

TEST_P(DtypeSweep, MatchesReferenceWithMasksAndCausal) {
  const DType dtype = GetParam();
  const std::pair<int64_t, int64_t> lengths[] = {{1, 7}, {7, 7}, {63, 65}, {257, 1000}};
  SweepTally tally;
  for (const auto& [l, s] : lengths) {
    for (MaskKind mask : {MaskKind::kNone, MaskKind::kBool, MaskKind::kFloat}) {
      for (bool causal : {false, true}) {
        if (causal && mask != MaskKind::kNone) continue;  // an error (tests/dispatch)
        Case c;
        c.batch = 2;
        c.heads_q = c.heads_kv = 2;
        c.q_len = l;
        c.kv_len = s;
        c.head_dim = 64;
        c.dtype = dtype;
        c.mask = mask;
        c.causal = causal;
        c.seed = static_cast<uint32_t>(l * 3 + s + static_cast<int>(mask));
        const CaseReport r = check_case(c);
        expect_cpu_backends_ran(c, r);
        tally.add(r);
      }
    }
  }
  tally.print(std::string(dtype_name(dtype)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DtypeSweep,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                           DType::kFloat64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Peaked rows (scores with std ~9): the running max changes by large amounts across tiles.
TEST(Dtypes, PeakedSoftmaxRows) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
    Case c;
    c.heads_q = c.heads_kv = 2;
    c.q_len = 65;
    c.kv_len = 257;
    c.head_dim = 64;
    c.dtype = dtype;
    c.input_std = 3.0;
    c.causal = true;
    expect_cpu_backends_ran(c, check_case(c));
  }
}

// ---- layouts ------------------------------------------------------------------------

TEST(Layouts, EveryQueryAndKeyValueLayoutCombination) {
  const Layout layouts[] = {Layout::kBHSD, Layout::kBSHD, Layout::kSliceD, Layout::kStridedD,
                            Layout::kHeadDimMajor};
  for (Layout ql : layouts) {
    for (Layout kl : layouts) {
      Case c;
      c.batch = 2;
      c.heads_q = c.heads_kv = 3;
      c.q_len = 65;
      c.kv_len = 63;
      c.head_dim = 80;
      c.head_dim_v = 24;
      c.q_layout = ql;
      c.kv_layout = kl;
      c.causal = ql == kl;
      c.seed = static_cast<uint32_t>(static_cast<int>(ql) * 10 + static_cast<int>(kl));
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

TEST(Layouts, HalfTypesInNonContiguousLayouts) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (Layout l : {Layout::kBSHD, Layout::kSliceD, Layout::kHeadDimMajor}) {
      Case c;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.enable_gqa = true;
      c.q_len = 63;
      c.kv_len = 65;
      c.head_dim = 24;
      c.dtype = dtype;
      c.q_layout = c.kv_layout = l;
      c.mask = MaskKind::kBool;
      c.mask_shape = {63, 65};
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

// Head dims off every vector width (1, 3, 17, 200, 300, 512) and Ev = 1.
TEST(OddHeadDims, NonMultiplesOfTheVectorWidth) {
  const std::pair<int64_t, int64_t> dims[] = {{1, 1}, {3, 5}, {17, 1}, {200, 17}, {300, 300},
                                              {512, 64}};
  for (const auto& [e, ev] : dims) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      Case c;
      c.heads_q = 2;
      c.heads_kv = 1;
      c.enable_gqa = true;
      c.q_len = 67;
      c.kv_len = 71;
      c.head_dim = e;
      c.head_dim_v = ev;
      c.dtype = dtype;
      c.causal = e % 2 == 1;
      c.q_layout = Layout::kSliceD;
      c.seed = static_cast<uint32_t>(e + ev);
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

// Multi-query attention: every query head on one kv head.
TEST(GroupedQuery, MultiQuerySingleKvHead) {
  Case c;
  c.batch = 2;
  c.heads_q = 8;
  c.heads_kv = 1;
  c.enable_gqa = true;
  c.q_len = 65;
  c.kv_len = 129;
  c.mask = MaskKind::kFloat;
  c.mask_shape = {1, 8, 1, 129};
  c.kv_layout = Layout::kBSHD;
  expect_cpu_backends_ran(c, check_case(c));
}

// ---- GQA, batch, 3-D ----------------------------------------------------------------

TEST(GroupedQuery, EightQueryHeadsOnTwoKvHeads) {
  for (bool causal : {false, true}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      Case c;
      c.batch = 2;
      c.heads_q = 8;
      c.heads_kv = 2;
      c.enable_gqa = true;
      c.q_len = 63;
      c.kv_len = 257;
      c.head_dim = 64;
      c.dtype = dtype;
      c.causal = causal;
      c.q_layout = Layout::kBSHD;
      c.kv_layout = Layout::kBSHD;
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

TEST(GroupedQuery, SixQueryHeadsOnThreeKvHeadsWithMask) {
  for (MaskKind mask : {MaskKind::kBool, MaskKind::kFloat}) {
    Case c;
    c.batch = 2;
    c.heads_q = 6;
    c.heads_kv = 3;
    c.enable_gqa = true;
    c.q_len = 7;
    c.kv_len = 65;
    c.head_dim = 24;
    c.mask = mask;
    c.mask_shape = {2, 6, 7, 65};
    expect_cpu_backends_ran(c, check_case(c));
  }
  Case c;  // the same with enable_gqa and Hq == Hkv
  c.heads_q = c.heads_kv = 3;
  c.enable_gqa = true;
  c.q_len = 9;
  c.kv_len = 5;
  expect_cpu_backends_ran(c, check_case(c));
}

TEST(GroupedQuery, UnbatchedAndFloat64) {
  Case c;
  c.unbatched = true;
  c.heads_q = 6;
  c.heads_kv = 2;
  c.enable_gqa = true;
  c.q_len = 17;
  c.kv_len = 19;
  c.head_dim = 8;
  c.dtype = DType::kFloat64;
  c.causal = true;
  expect_cpu_backends_ran(c, check_case(c));
}

TEST(Batch, SeveralBatchesAndHeads) {
  for (bool causal : {false, true}) {
    Case c;
    c.batch = 3;
    c.heads_q = c.heads_kv = 5;
    c.q_len = 65;
    c.kv_len = 63;
    c.head_dim = 24;
    c.causal = causal;
    c.q_layout = Layout::kBSHD;
    expect_cpu_backends_ran(c, check_case(c));
  }
}

TEST(Unbatched, ThreeDimensionalInputsGiveThreeDimensionalOutput) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    for (MaskKind mask : {MaskKind::kNone, MaskKind::kBool, MaskKind::kFloat}) {
      Case c;
      c.unbatched = true;
      c.heads_q = c.heads_kv = 3;
      c.q_len = 7;
      c.kv_len = 65;
      c.head_dim = 80;
      c.head_dim_v = 64;
      c.dtype = dtype;
      c.mask = mask;
      c.causal = mask == MaskKind::kNone;
      c.q_layout = Layout::kBSHD;
      // matches_reference checks out [Hq, L, Ev] and lse [Hq, L].
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

TEST(Unbatched, MaskOfTwoDimensionsBroadcastsOverHeads) {
  Case c;
  c.unbatched = true;
  c.heads_q = c.heads_kv = 2;
  c.q_len = 7;
  c.kv_len = 9;
  c.mask = MaskKind::kFloat;
  c.mask_shape = {7, 9};
  expect_cpu_backends_ran(c, check_case(c));
}

// ---- scale ---------------------------------------------------------------------------

TEST(Scale, CustomScales) {
  for (double scale : {0.01, 1.7, -0.3, 0.0}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
      Case c;
      c.heads_q = c.heads_kv = 2;
      c.q_len = 63;
      c.kv_len = 65;
      c.head_dim = 24;
      c.scale = scale;
      c.dtype = dtype;
      c.causal = scale > 1;
      expect_cpu_backends_ran(c, check_case(c));
    }
  }
}

// The default scale is 1/sqrt(E) (PyTorch's): passing it explicitly gives the same output.
TEST(Scale, DefaultIsOneOverSqrtHeadDim) {
  std::mt19937 rng(3);
  const Tensor q = random_tensor({1, 2, 9, 80}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor k = random_tensor({1, 2, 11, 80}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor v = random_tensor({1, 2, 11, 16}, DType::kFloat32, Layout::kBHSD, rng);
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    sdpa_kernel guard(b);
    SDPAOptions explicit_scale;
    explicit_scale.scale = 1.0 / std::sqrt(80.0);
    const auto a = to_doubles(scaled_dot_product_attention(q, k, v));
    const auto e = to_doubles(scaled_dot_product_attention(q, k, v, explicit_scale));
    EXPECT_EQ(a, e) << backend_name(b);
  }
}

// ---- the plain entry point ----------------------------------------------------------

TEST(EntryPoints, PlainCallEqualsWithLseCall) {
  std::mt19937 rng(5);
  const Tensor q = random_tensor({2, 4, 33, 64}, DType::kFloat32, Layout::kBSHD, rng);
  const Tensor k = random_tensor({2, 2, 40, 64}, DType::kFloat32, Layout::kBSHD, rng);
  const Tensor v = random_tensor({2, 2, 40, 64}, DType::kFloat32, Layout::kBSHD, rng);
  SDPAOptions o;
  o.enable_gqa = true;
  o.is_causal = true;
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    sdpa_kernel guard(b);
    const Tensor out = scaled_dot_product_attention(q, k, v, o);
    const AttentionResult r = scaled_dot_product_attention_with_lse(q, k, v, o);
    EXPECT_EQ(r.backend, b);
    EXPECT_TRUE(out.is_contiguous()) << "out is documented contiguous";
    EXPECT_EQ(to_doubles(out), to_doubles(r.out)) << backend_name(b);
  }
}

// Without a guard the default choice runs and agrees with the reference.
TEST(EntryPoints, DefaultSelectionMatchesReference) {
  Case c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 4;
  c.q_len = 100;
  c.kv_len = 120;
  const CaseInputs in = make_inputs(c);
  const AttentionResult r = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options);
  EXPECT_EQ(r.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_TRUE(matches_reference(r.out, r.lse, in.ref, c.dtype, false));
}

// Run-to-run determinism (docs/semantics.md: every CPU path is bit-for-bit deterministic).
TEST(EntryPoints, RepeatedCallsAreBitIdentical) {
  Case c;
  c.batch = 2;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.enable_gqa = true;
  c.q_len = 257;
  c.kv_len = 300;
  c.causal = true;
  const CaseInputs in = make_inputs(c);
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    sdpa_kernel guard(b);
    const auto first = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options);
    for (int rep = 0; rep < 3; ++rep) {
      const auto again = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options);
      EXPECT_EQ(to_doubles(first.out), to_doubles(again.out)) << backend_name(b);
      EXPECT_EQ(to_doubles(first.lse), to_doubles(again.lse)) << backend_name(b);
    }
  }
}

// docs/semantics.md: bit-for-bit identical for any thread count.
TEST(EntryPoints, BitIdenticalForAnyThreadCount) {
  Case c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.enable_gqa = true;
  c.q_len = 200;
  c.kv_len = 170;
  c.mask = MaskKind::kFloat;
  c.mask_shape = {2, 1, 200, 170};
  c.dropout_p = 0.2;
  const CaseInputs in = make_inputs(c);
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    sdpa_kernel guard(b);
    std::vector<double> first;
    for (int threads : {1, 2, 3}) {
      const test::ScopedThreads scoped(threads);
      const AttentionResult r = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options);
      auto got = to_doubles(r.out);
      const auto lse = to_doubles(r.lse);
      got.insert(got.end(), lse.begin(), lse.end());
      if (first.empty()) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << backend_name(b) << " with " << threads << " threads";
      }
    }
  }
}

// The flash forward lets threads start the next (batch, kv head)s while others finish
// earlier ones (PackedKv's two slots). Many small kv-head groups with more threads than
// cores: a thread that is preempted falls behind by several groups, so a slot reused too
// early would hand it another group's k/v.
TEST(EntryPoints, FlashThreadsRunAheadAcrossKvHeads) {
  Case c;
  c.batch = 3;
  c.heads_q = 12;
  c.heads_kv = 6;
  c.enable_gqa = true;
  c.q_len = 130;
  c.kv_len = 257;
  c.causal = true;
  c.dtype = DType::kFloat16;
  const CaseInputs in = make_inputs(c);
  sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  for (int threads : {2, 3, 5}) {
    const test::ScopedThreads scoped(threads);
    for (int rep = 0; rep < 4; ++rep) {
      const AttentionResult r = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options);
      EXPECT_TRUE(matches_reference(r.out, r.lse, in.ref, c.dtype, false))
          << threads << " threads, repetition " << rep;
    }
  }
}

}  // namespace
}  // namespace sdpa::test
