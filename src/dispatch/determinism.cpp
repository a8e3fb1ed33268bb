#include <atomic>

#include "sdpa/sdpa.h"

namespace sdpa {
namespace {
std::atomic<bool> g_deterministic{false};
}  // namespace

void use_deterministic_algorithms(bool enabled) { g_deterministic = enabled; }
bool are_deterministic_algorithms_enabled() { return g_deterministic.load(); }

}  // namespace sdpa
