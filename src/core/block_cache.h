#pragma once
// Reuse of large freed blocks. A fresh multi-megabyte block costs the kernel a page fault
// and a zeroing pass per page on first touch; for a sparse attention call (a sliding
// window, packed documents) allocating its output that way costs about a tenth of the
// call. Blocks of kLargeBlock bytes or more are therefore kept after they are freed and
// handed out again for the same rounded size (the idea of PyTorch's CUDA caching
// allocator, bounded here by kCacheLimit).

#include <cstddef>

namespace sdpa::detail {

/// Blocks from this size on are huge-page aligned, marked for transparent huge pages and
/// cached; sizes are rounded up to a multiple of it.
inline constexpr size_t kLargeBlock = size_t{2} << 20;
/// At most this many bytes stay cached; a freed block that would exceed it is returned to
/// the system.
inline constexpr size_t kCacheLimit = size_t{512} << 20;

/// A block of at least `bytes` (a multiple of 64), 64-byte aligned; nullptr when out of
/// memory. Large blocks come from the cache when one of the same rounded size is there.
void* acquire_block(size_t bytes);
/// Gives back a block from acquire_block(bytes).
void release_block(void* block, size_t bytes);
/// Bytes held in the cache.
size_t cached_block_bytes();
/// Returns every cached block to the system.
void empty_block_cache();

}  // namespace sdpa::detail
