// CPU capability: reporting, forcing AVX-512 / AVX2 / scalar per thread, and a
// representative subset of the correctness sweep re-run under every capability this CPU
// supports, so each compiled flash kernel is checked against the reference.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "common/capability.h"
#include "common/harness.h"
#include "cpu/capability.h"
#include "cpu/flash_tile.h"

namespace sdpa::test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
namespace bcpu = sdpa::backends::cpu;

TEST(Capability, ReportsOneOfTheKnownLevels) {
  EXPECT_THAT(bcpu::get_cpu_capability(), AnyOf("AVX512", "AVX2", "DEFAULT"));
  EXPECT_THAT(bcpu::detected_cpu_capability(), AnyOf("AVX512", "AVX2", "DEFAULT"));
  EXPECT_LE(capability_rank(bcpu::get_cpu_capability()),
            capability_rank(bcpu::detected_cpu_capability()));
}

bool is_known_level(const std::string& level) {
  return level == "AVX512" || level == "AVX2" || level == "DEFAULT";
}

// Run once plainly and once by ctest per known SDPA_CPU_CAPABILITY value
// (tests/CMakeLists.txt): the variable lowers the level; one above the CPU's gives the
// CPU's best.
TEST(Capability, EnvironmentVariableLowersTheLevel) {
  const char* env = std::getenv("SDPA_CPU_CAPABILITY");
  const std::string want = env != nullptr ? env : "";
  if (!want.empty() && !is_known_level(want)) GTEST_SKIP() << "unknown value: the next test";
  const std::string detected = bcpu::detected_cpu_capability();
  std::string expected = detected;
  if (!want.empty() && capability_rank(want) <= capability_rank(detected)) expected = want;
  EXPECT_EQ(bcpu::get_cpu_capability(), expected) << "SDPA_CPU_CAPABILITY=" << want;
}

// Run by ctest with an unknown SDPA_CPU_CAPABILITY value: the capability query and a
// FLASH call fail with an error naming the variable, the value and the accepted ones.
TEST(Capability, UnknownEnvironmentValueIsAnError) {
  const char* env = std::getenv("SDPA_CPU_CAPABILITY");
  if (env == nullptr || *env == '\0' || is_known_level(env))
    GTEST_SKIP() << "needs an unknown value";
  const auto message =
      AllOf(HasSubstr("SDPA_CPU_CAPABILITY"), HasSubstr(std::string("'") + env + "'"),
            HasSubstr("AVX512, AVX2, DEFAULT"));
  try {
    bcpu::get_cpu_capability();
    ADD_FAILURE() << "get_cpu_capability() did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), message);
  }
  const Tensor q = Tensor::zeros({1, 1, 4, 8}, DType::kFloat32);
  const sdpa_kernel flash_only(SDPBackend::FLASH_ATTENTION);
  try {
    scaled_dot_product_attention(q, q, q);
    ADD_FAILURE() << "a FLASH call did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), message);
  }
}

TEST(Capability, SetForcesEverySupportedLevelAndEmptyRestores) {
  ScopedCapability reset;
  const std::string initial = bcpu::get_cpu_capability();
  for (const std::string& c : supported_capabilities()) {
    bcpu::set_cpu_capability(c);
    EXPECT_EQ(bcpu::get_cpu_capability(), c);
    EXPECT_EQ(std::string(cpu::capability_name(cpu::active_capability())), c);
  }
  bcpu::set_cpu_capability("");
  EXPECT_EQ(bcpu::get_cpu_capability(), initial);
}

TEST(Capability, SetRejectsUnknownAndUnattainableLevels) {
  ScopedCapability reset;
  for (const char* bad : {"SSE9", "avx3", "NEON", " AVX2"}) {
    try {
      bcpu::set_cpu_capability(bad);
      ADD_FAILURE() << "set_cpu_capability(\"" << bad << "\") did not throw";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(bad));
    }
  }
  if (bcpu::detected_cpu_capability() != "AVX512") {
    EXPECT_THROW(bcpu::set_cpu_capability("AVX512"), Error);
  }
}

TEST(Capability, OverrideIsThreadLocal) {
  ScopedCapability reset;
  const std::string initial = bcpu::get_cpu_capability();
  bcpu::set_cpu_capability("DEFAULT");
  std::string seen_in_other_thread;
  std::thread t([&] { seen_in_other_thread = bcpu::get_cpu_capability(); });
  t.join();
  EXPECT_EQ(seen_in_other_thread, initial);
  EXPECT_EQ(bcpu::get_cpu_capability(), "DEFAULT");
}

// Each level has its own compiled flash kernel (so forcing a level changes the code run).
TEST(Capability, EachLevelHasItsOwnFlashKernel) {
  const auto scalar = cpu::flash_q_block_for(cpu::Capability::kDefault);
  const auto avx2 = cpu::flash_q_block_for(cpu::Capability::kAVX2);
  const auto avx512 = cpu::flash_q_block_for(cpu::Capability::kAVX512);
  ASSERT_NE(scalar, nullptr);
  ASSERT_NE(avx2, nullptr);
  ASSERT_NE(avx512, nullptr);
  EXPECT_NE(scalar, avx2);
  EXPECT_NE(avx2, avx512);
  EXPECT_NE(scalar, avx512);
}

// The representative subset: odd sizes around the tile and vector widths, masks, causal,
// GQA, half types, strided layouts, masked rows and dropout.
std::vector<Case> representative_cases() {
  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  for (const auto& [l, s] : {std::pair<int64_t, int64_t>{1, 1}, {7, 63}, {65, 257}, {63, 65}}) {
    for (int64_t e : {8, 24, 80}) {
      Case c;
      c.heads_q = c.heads_kv = 2;
      c.q_len = l;
      c.kv_len = s;
      c.head_dim = e;
      c.head_dim_v = e == 24 ? 80 : e;
      c.causal = (l + e) % 2 == 1;
      add(c);
    }
  }
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    Case c;
    c.batch = 2;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.enable_gqa = true;
    c.q_len = 65;
    c.kv_len = 129;
    c.head_dim = 64;
    c.dtype = dtype;
    c.q_layout = Layout::kBSHD;
    c.kv_layout = Layout::kSliceD;
    c.causal = true;
    add(c);
    c.causal = false;
    c.mask = MaskKind::kBool;
    c.mask_shape = {2, 1, 65, 129};
    c.masked_rows = {0, 64};
    add(c);
    c.mask = MaskKind::kFloat;
    c.mask_shape = {1, 8, 1, 129};
    c.masked_rows.clear();
    add(c);
  }
  {
    Case c;
    c.heads_q = 6;
    c.heads_kv = 3;
    c.enable_gqa = true;
    c.q_len = 257;
    c.kv_len = 63;
    c.head_dim = 128;
    c.head_dim_v = 24;
    c.q_layout = Layout::kHeadDimMajor;
    c.kv_layout = Layout::kStridedD;
    add(c);
    c.dropout_p = 0.2;
    c.head_dim = 256;
    add(c);
  }
  {
    Case c;  // the split-KV decode path
    c.heads_q = 8;
    c.heads_kv = 2;
    c.enable_gqa = true;
    c.q_len = 1;
    c.kv_len = 1000;
    c.head_dim = 96;
    c.dtype = DType::kBFloat16;
    c.q_layout = c.kv_layout = Layout::kBSHD;
    add(c);
  }
  {
    Case c;
    c.unbatched = true;
    c.heads_q = c.heads_kv = 2;
    c.q_len = 33;
    c.kv_len = 1000;
    c.head_dim = 64;
    c.input_std = 3.0;
    c.causal = true;
    add(c);
  }
  return cases;
}

class ForcedCapability : public ::testing::TestWithParam<std::string> {};

TEST_P(ForcedCapability, RepresentativeSweepMatchesReference) {
  const std::string capability = GetParam();
  if (capability_rank(capability) > capability_rank(bcpu::detected_cpu_capability())) {
    GTEST_SKIP() << capability << " is not supported by this CPU ("
                 << bcpu::detected_cpu_capability() << ")";
  }
  ScopedCapability reset;
  bcpu::set_cpu_capability(capability);
  ASSERT_EQ(bcpu::get_cpu_capability(), capability);
  SweepTally tally;
  for (const Case& c : representative_cases()) {
    const CaseReport r = check_case(c);
    EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION))
        << capability << ": FLASH_ATTENTION did not run " << c.describe();
    EXPECT_TRUE(r.ran_backend(SDPBackend::MATH)) << capability << ": " << c.describe();
    tally.add(r);
    ASSERT_EQ(bcpu::get_cpu_capability(), capability) << "a call changed the capability";
  }
  tally.print("capability " + capability);
}

INSTANTIATE_TEST_SUITE_P(Levels, ForcedCapability,
                         ::testing::Values("AVX512", "AVX2", "DEFAULT"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sdpa::test
