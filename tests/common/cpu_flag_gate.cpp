// Test processes that rerun the bfloat16 tests with a CPU feature switched off
// (SDPA_DISABLE_AMX=1, SDPA_DISABLE_BF16_DOT=1) test something new only where the CPU has
// that feature; elsewhere they repeat the default process (the heaviest tests of the
// sanitizer job). Their CTest entries name the feature in SDPA_TESTS_ONLY_WITH_CPU_FLAG (a
// flag of /proc/cpuinfo, e.g. amx_bf16), and on CPUs without it the process skips every
// test in its global set-up.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

bool CpuHasFlag(const std::string& flag) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string word;
    while (words >> word) {
      if (word == flag) return true;
    }
    return false;
  }
  return false;
}

class CpuFlagGate : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* flag = std::getenv("SDPA_TESTS_ONLY_WITH_CPU_FLAG");
    if (flag == nullptr || *flag == '\0' || CpuHasFlag(flag)) return;
    GTEST_SKIP() << "skipped: this CPU lacks " << flag
                 << ", so switching it off repeats the default test process";
  }
};

const ::testing::Environment* const kCpuFlagGate =
    ::testing::AddGlobalTestEnvironment(new CpuFlagGate);

}  // namespace
