#include "core/block_cache.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::detail {
namespace {

struct Cache {
  std::mutex mutex;
  std::map<size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks
  size_t bytes = 0;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: blocks may be freed during exit
  return *c;
}

size_t rounded(size_t bytes) { return (bytes + kLargeBlock - 1) / kLargeBlock * kLargeBlock; }

// Small blocks: malloc'd with room to align, the malloc'd address stored just before the
// aligned one. glibc's aligned_alloc carves each block out of a larger chunk and frees
// the pieces around it, about five times a malloc's work; a tiny attention call
// allocates several small blocks (output, lse, per-thread scratch).
void* acquire_small(size_t bytes) {
  void* raw = std::malloc(bytes + kAlignment);
  if (raw == nullptr) return nullptr;
  const auto aligned = (reinterpret_cast<uintptr_t>(raw) + kAlignment) & ~(kAlignment - 1);
  reinterpret_cast<void**>(aligned)[-1] = raw;  // malloc aligns to 16 > sizeof(void*)
  return reinterpret_cast<void*>(aligned);
}

void release_small(void* block) { std::free(static_cast<void**>(block)[-1]); }

}  // namespace

void* acquire_block(size_t bytes) {
  if (bytes < kLargeBlock) return acquire_small(bytes);
  const size_t size = rounded(bytes);
  {
    Cache& c = cache();
    const std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* block = it->second.back();
      it->second.pop_back();
      c.bytes -= size;
      return block;
    }
  }
  void* block = std::aligned_alloc(kLargeBlock, size);
  if (block != nullptr) madvise(block, size, MADV_HUGEPAGE);  // a hint: failure is harmless
  return block;
}

void release_block(void* block, size_t bytes) {
  if (block == nullptr) return;
  if (bytes < kLargeBlock) {
    release_small(block);
    return;
  }
  const size_t size = rounded(bytes);
  {
    Cache& c = cache();
    const std::lock_guard<std::mutex> lock(c.mutex);
    if (c.bytes + size <= kCacheLimit) {
      c.free_blocks[size].push_back(block);
      c.bytes += size;
      return;
    }
  }
  std::free(block);
}

size_t cached_block_bytes() {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.bytes;
}

void empty_block_cache() {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [size, blocks] : c.free_blocks) {
    for (void* block : blocks) std::free(block);
  }
  c.free_blocks.clear();
  c.bytes = 0;
}

}  // namespace sdpa::detail
