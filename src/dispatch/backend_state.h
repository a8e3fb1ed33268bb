#pragma once
// Process-wide enable flags and the calling thread's sdpa_kernel stack.

#include <optional>
#include <vector>

#include "sdpa/backend.h"

namespace sdpa::detail {

/// The process-wide flag of `backend` (true for ERROR never).
bool flag_enabled(SDPBackend backend);
/// The innermost sdpa_kernel guard's ordered list on this thread, if any.
const std::vector<SDPBackend>* current_guard();

}  // namespace sdpa::detail
