#include "core/block_cache.h"

#include <sys/mman.h>

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

}  // namespace

void* acquire_block(size_t bytes) {
  if (bytes < kLargeBlock) return std::aligned_alloc(kAlignment, bytes);
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
  if (bytes >= kLargeBlock) {
    const size_t size = rounded(bytes);
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
