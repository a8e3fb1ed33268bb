#include "cpu/capability.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "cpu/amx_bf16.h"
#include "cpu/bf16_dot.h"
#include "hwy/targets.h"
#include "sdpa/backend.h"
#include "sdpa/error.h"

namespace sdpa::cpu {
namespace {

thread_local std::optional<Capability> t_override;

std::optional<Capability> parse(std::string_view name) {
  if (name == "AVX512") return Capability::kAVX512;
  if (name == "AVX2") return Capability::kAVX2;
  if (name == "DEFAULT") return Capability::kDefault;
  return std::nullopt;
}

// Throws sdpa::Error for an unknown value: ignoring a typo would silently run a level the
// user did not ask for. Thrown from active_capability's static initializer, the error
// repeats on every call (the initializer runs again).
Capability from_environment() {
  const Capability best = detected_capability();
  const char* env = std::getenv("SDPA_CPU_CAPABILITY");
  if (env == nullptr || *env == '\0') return best;
  const std::optional<Capability> wanted = parse(env);
  SDPA_CHECK(wanted.has_value(),
             "SDPA_CPU_CAPABILITY: expected AVX512, AVX2, DEFAULT or unset, got '", env, "'");
  // Like PyTorch's ATEN_CPU_CAPABILITY, a level above the CPU's gives the CPU's best, so
  // one setting serves machines of different kinds.
  return std::min(*wanted, best);
}

}  // namespace

std::string_view capability_name(Capability c) {
  switch (c) {
    case Capability::kAVX512: return "AVX512";
    case Capability::kAVX2: return "AVX2";
    case Capability::kDefault: return "DEFAULT";
  }
  return "DEFAULT";
}

Capability detected_capability() {
  const int64_t targets = hwy::SupportedTargets();
  if (targets & HWY_AVX3) return Capability::kAVX512;
  if (targets & HWY_AVX2) return Capability::kAVX2;
  return Capability::kDefault;
}

bool bf16_dot_available() {
  static const bool available = [] {
    const char* off = std::getenv("SDPA_DISABLE_BF16_DOT");
    return __builtin_cpu_supports("avx512bf16") && !(off != nullptr && std::string(off) == "1");
  }();
  return available;
}

bool vbmi_available() {
  static const bool available = __builtin_cpu_supports("avx512vbmi");
  return available;
}

Capability active_capability() {
  if (t_override) return *t_override;
  static const Capability from_env = from_environment();
  return from_env;
}

}  // namespace sdpa::cpu

namespace sdpa::backends::cpu {

std::string get_cpu_capability() {
  return std::string(sdpa::cpu::capability_name(sdpa::cpu::active_capability()));
}

bool amx_bf16_available() { return sdpa::cpu::amx_available(); }

std::string detected_cpu_capability() {
  return std::string(sdpa::cpu::capability_name(sdpa::cpu::detected_capability()));
}

void set_cpu_capability(std::string_view capability) {
  if (capability.empty()) {
    sdpa::cpu::t_override.reset();
    return;
  }
  const auto wanted = sdpa::cpu::parse(capability);
  SDPA_CHECK(wanted.has_value(), "capability: expected AVX512, AVX2, DEFAULT or \"\", got '",
             capability, "'");
  SDPA_CHECK(*wanted <= sdpa::cpu::detected_capability(), "capability: ", capability,
             " is not supported by this CPU (best: ", detected_cpu_capability(), ")");
  sdpa::cpu::t_override = *wanted;
}

}  // namespace sdpa::backends::cpu
