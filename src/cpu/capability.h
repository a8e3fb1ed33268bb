#pragma once
// The SIMD level CPU kernels run at, chosen once per call.

#include <string_view>

namespace sdpa::cpu {

enum class Capability { kDefault, kAVX2, kAVX512 };

/// "DEFAULT", "AVX2", "AVX512".
std::string_view capability_name(Capability c);
/// Best level this CPU runs (Highway's runtime detection).
Capability detected_capability();
/// Level for the calling thread: set_cpu_capability override, else SDPA_CPU_CAPABILITY
/// (which can only lower the detected level), else detected. Throws sdpa::Error when
/// SDPA_CPU_CAPABILITY holds an unknown value.
Capability active_capability();

}  // namespace sdpa::cpu
