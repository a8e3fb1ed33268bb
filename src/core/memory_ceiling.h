#pragma once
// The most memory one host allocation may ask for: beyond it Storage::allocate throws
// "out of memory" at once instead of letting an overcommitted request reach the OOM
// killer when its pages are touched.

#include <cstddef>
#include <string>

namespace sdpa::detail {

/// The ceiling and where it comes from.
struct MemoryCeiling {
  size_t bytes;
  std::string source;  ///< e.g. "physical memory", "cgroup memory.max", "SDPA_MEMORY_LIMIT"
};

/// The smallest of: physical memory, the cgroup's memory limit (v2 memory.max or v1
/// memory.limit_in_bytes), RLIMIT_AS / RLIMIT_DATA, and the environment variable
/// SDPA_MEMORY_LIMIT (bytes, with an optional K/M/G/T suffix, powers of 1024). Read once
/// per process.
const MemoryCeiling& memory_ceiling();

}  // namespace sdpa::detail
