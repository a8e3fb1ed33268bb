#pragma once
// CPU capability levels for tests that run every SIMD path on one machine: which levels
// this CPU runs, and forcing one for the calling thread (set_cpu_capability is per thread).

#include <string>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa::test {

/// Orders capability names: AVX512 2, AVX2 1, anything else (DEFAULT) 0.
inline int capability_rank(const std::string& capability) {
  return capability == "AVX512" ? 2 : capability == "AVX2" ? 1 : 0;
}

/// The levels this CPU runs, best first ("AVX512", "AVX2", "DEFAULT").
inline std::vector<std::string> supported_capabilities() {
  const int best = capability_rank(backends::cpu::detected_cpu_capability());
  std::vector<std::string> out;
  for (const char* c : {"AVX512", "AVX2", "DEFAULT"}) {
    if (capability_rank(c) <= best) out.emplace_back(c);
  }
  return out;
}

/// Forces a capability for the calling thread while alive (the default constructor forces
/// none) and restores the default (SDPA_CPU_CAPABILITY or the CPU's best) when destroyed,
/// also when a test fails part way.
class ScopedCapability {
 public:
  ScopedCapability() = default;
  explicit ScopedCapability(const std::string& capability) {
    backends::cpu::set_cpu_capability(capability);
  }
  ~ScopedCapability() { backends::cpu::set_cpu_capability(""); }
  ScopedCapability(const ScopedCapability&) = delete;
  ScopedCapability& operator=(const ScopedCapability&) = delete;
};

}  // namespace sdpa::test
