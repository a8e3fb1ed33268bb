#pragma once
// Process-wide enable flags and the calling thread's sdpa_kernel stack.

#include <array>
#include <optional>
#include <span>
#include <vector>

#include "sdpa/backend.h"

namespace sdpa::detail {

/// Every SDPBackend but ERROR.
inline constexpr size_t kNumBackends = 5;

/// Backends in the order selection tries them, held inline: selection reads the list on
/// every call, and a tiny call cannot afford a heap allocation for it.
struct BackendList {
  std::array<SDPBackend, kNumBackends> items{};
  size_t count = 0;
  std::span<const SDPBackend> span() const { return {items.data(), count}; }
  bool contains(SDPBackend backend) const {
    for (size_t i = 0; i < count; ++i) {
      if (items[i] == backend) return true;
    }
    return false;
  }
};

/// active_backends() without the vector.
BackendList active_backend_list();

/// The process-wide flag of `backend` (true for ERROR never).
bool flag_enabled(SDPBackend backend);
/// The innermost sdpa_kernel guard's ordered list on this thread, if any.
const std::vector<SDPBackend>* current_guard();

}  // namespace sdpa::detail
