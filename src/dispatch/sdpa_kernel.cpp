#include <algorithm>

#include "dispatch/backend_state.h"
#include "sdpa/error.h"

namespace sdpa {
namespace {
// Thread-local on purpose: PyTorch's guard flips process-global flags, so one thread's
// guard leaks into every other thread's calls.
thread_local std::vector<std::vector<SDPBackend>> t_guard_stack;
}  // namespace

namespace detail {
const std::vector<SDPBackend>* current_guard() {
  return t_guard_stack.empty() ? nullptr : &t_guard_stack.back();
}
}  // namespace detail

sdpa_kernel::sdpa_kernel(std::vector<SDPBackend> backends, bool set_priority) {
  SDPA_CHECK(!backends.empty(), "sdpa_kernel: expected at least one backend, got none");
  for (SDPBackend b : backends) {
    SDPA_CHECK(b != SDPBackend::ERROR, "sdpa_kernel: ERROR is not a backend");
  }
  std::vector<SDPBackend> order;
  if (set_priority) {
    for (SDPBackend b : backends) {
      if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
    }
  } else {
    for (SDPBackend b : default_priority_order()) {
      if (std::find(backends.begin(), backends.end(), b) != backends.end()) order.push_back(b);
    }
  }
  t_guard_stack.push_back(std::move(order));
}

sdpa_kernel::~sdpa_kernel() { t_guard_stack.pop_back(); }

bool sdpa_kernel_active() { return !t_guard_stack.empty(); }

}  // namespace sdpa
