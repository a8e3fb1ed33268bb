// Test processes that rerun the bfloat16 tests with a CPU feature switched off
// (SDPA_DISABLE_AMX=1, SDPA_DISABLE_BF16_DOT=1) test something new only where the CPU has
// that feature; elsewhere they repeat the default process (the heaviest tests of the
// sanitizer job). Their CTest entries name the feature in SDPA_TESTS_ONLY_WITH_CPU_FLAG
// (amx_bf16 or avx512_bf16), and where the CPU lacks it the process skips every test in
// its global set-up. The checks are the library's own, without the switches.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cpu/amx_bf16.h"

namespace {

class CpuFlagGate : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("SDPA_TESTS_ONLY_WITH_CPU_FLAG");
    if (env == nullptr || *env == '\0') return;
    const std::string flag = env;
    bool present = false;
    if (flag == "amx_bf16") {
      present = sdpa::cpu::cpu_and_os_have_amx();
    } else if (flag == "avx512_bf16") {
      present = __builtin_cpu_supports("avx512bf16");
    } else {
      GTEST_FAIL() << "SDPA_TESTS_ONLY_WITH_CPU_FLAG: expected amx_bf16 or avx512_bf16, got '"
                   << flag << "'";
    }
    if (!present) {
      GTEST_SKIP() << "skipped: this CPU lacks " << flag
                   << ", so switching it off repeats the default test process";
    }
  }
};

const ::testing::Environment* const kCpuFlagGate =
    ::testing::AddGlobalTestEnvironment(new CpuFlagGate);

}  // namespace
