// Determinism: every CPU path is bit-for-bit identical run to run and for any OpenMP
// thread count (docs/semantics.md "Determinism"); use_deterministic_algorithms is a flag
// recorded in the params.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention_test_util.h"
#include "common/threads.h"

namespace sdpa_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;

using sdpa::test::ScopedThreads;

struct DetCase {
  std::string name;
  SDPBackend backend;
  DType dtype;
  bool causal;
  double dropout_p;
};

class Determinism : public ::testing::TestWithParam<DetCase> {};

FwdBwd run_once(const DetCase& c, int threads) {
  // Several q and kv blocks per head and a GQA group so threads really split the work.
  // B * Hkv = 4: one and two threads run each head whole (FlashHeadBackward), three take
  // the two-pass route, so the two are compared bit for bit too.
  const Tensor q = randn({2, 4, 200, 64}, c.dtype, 41);
  const Tensor k = randn({2, 2, 300, 64}, c.dtype, 42);
  const Tensor v = randn({2, 2, 300, 40}, c.dtype, 43);
  const Tensor go = randn({2, 4, 200, 40}, c.dtype, 44);
  SDPAOptions o;
  o.enable_gqa = true;
  o.is_causal = c.causal;
  o.dropout_p = c.dropout_p;
  o.dropout_state = sdpa::PhiloxState{17, 3};
  ScopedThreads scoped(threads);
  return run_fwd_bwd(c.backend, q, k, v, go, o);
}

void expect_bit_identical(const FwdBwd& a, const FwdBwd& b, const std::string& what) {
  EXPECT_TRUE(bit_identical(a.fwd.out, b.fwd.out)) << what << ": out";
  EXPECT_TRUE(bit_identical(a.fwd.lse, b.fwd.lse)) << what << ": lse";
  EXPECT_TRUE(bit_identical(a.grads.grad_q, b.grads.grad_q)) << what << ": grad_q";
  EXPECT_TRUE(bit_identical(a.grads.grad_k, b.grads.grad_k)) << what << ": grad_k";
  EXPECT_TRUE(bit_identical(a.grads.grad_v, b.grads.grad_v)) << what << ": grad_v";
}

TEST_P(Determinism, BitIdenticalRunToRunAndAcrossThreadCounts) {
  const DetCase& c = GetParam();
  const FwdBwd two = run_once(c, 2);
  EXPECT_EQ(two.fwd.backend, c.backend);
  EXPECT_EQ(two.grads.backend, c.backend);
  expect_bit_identical(two, run_once(c, 2), "two threads, run to run");
  expect_bit_identical(two, run_once(c, 1), "one thread vs two");
  expect_bit_identical(two, run_once(c, 3), "three threads vs two");
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Determinism,
    ::testing::Values(
        DetCase{"FlashF32", SDPBackend::FLASH_ATTENTION, DType::kFloat32, false, 0.0},
        DetCase{"FlashF32CausalDropout", SDPBackend::FLASH_ATTENTION, DType::kFloat32, true, 0.2},
        DetCase{"FlashBf16Causal", SDPBackend::FLASH_ATTENTION, DType::kBFloat16, true, 0.0},
        DetCase{"MathF32Dropout", SDPBackend::MATH, DType::kFloat32, false, 0.2},
        DetCase{"MathF64Causal", SDPBackend::MATH, DType::kFloat64, true, 0.0}),
    [](const ::testing::TestParamInfo<DetCase>& info) { return info.param.name; });

TEST(DeterminismCapabilities, EveryCapabilityIsDeterministicAcrossThreadCounts) {
  const DetCase c{"", SDPBackend::FLASH_ATTENTION, DType::kFloat32, true, 0.1};
  for (const std::string& cap : supported_capabilities()) {
    ScopedCapability scoped(cap);
    expect_bit_identical(run_once(c, 2), run_once(c, 1), cap);
  }
}

TEST(DeterministicAlgorithms, FlagTogglesAndIsRecordedInParams) {
  const bool saved = sdpa::are_deterministic_algorithms_enabled();
  const Tensor q = randn({1, 1, 4, 8}, DType::kFloat32, 1);
  sdpa::use_deterministic_algorithms(true);
  EXPECT_TRUE(sdpa::are_deterministic_algorithms_enabled());
  EXPECT_TRUE(sdpa::make_params(q, q, q).deterministic);
  sdpa::use_deterministic_algorithms(false);
  EXPECT_FALSE(sdpa::are_deterministic_algorithms_enabled());
  EXPECT_FALSE(sdpa::make_params(q, q, q).deterministic);
  sdpa::use_deterministic_algorithms(true);
  EXPECT_TRUE(sdpa::are_deterministic_algorithms_enabled());
  sdpa::use_deterministic_algorithms(saved);
}

TEST(DeterministicAlgorithms, FlashStillRunsAndGivesTheSameBitsWithTheFlagOn) {
  // Every CPU path is deterministic already: the flag neither refuses FLASH nor changes it.
  const bool saved = sdpa::are_deterministic_algorithms_enabled();
  const DetCase c{"", SDPBackend::FLASH_ATTENTION, DType::kFloat32, true, 0.0};
  sdpa::use_deterministic_algorithms(false);
  const FwdBwd off = run_once(c, 2);
  sdpa::use_deterministic_algorithms(true);
  const FwdBwd on = run_once(c, 2);
  sdpa::use_deterministic_algorithms(saved);
  EXPECT_EQ(on.grads.backend, SDPBackend::FLASH_ATTENTION);
  expect_bit_identical(off, on, "flag off vs on");
}

}  // namespace
}  // namespace sdpa_test
