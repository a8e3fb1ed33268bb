#pragma once
// Fault injection for tests: make a chosen Storage::allocate fail as a real out-of-memory
// would, so that every allocation of a call (per-thread scratch inside OpenMP regions
// included) can be shown to end in sdpa::Error, never std::terminate or a hang.

#include <cstdint>

namespace sdpa::detail {

/// From now on, the allocation after `allocations` more successful ones throws
/// "out of memory" (0: the next one); negative: none fails (the default).
void fail_allocation_after(int64_t allocations);

}  // namespace sdpa::detail
