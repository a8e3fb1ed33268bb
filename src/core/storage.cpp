#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <new>

#include "core/allocation_faults.h"
#include "core/block_cache.h"
#include "core/memory_ceiling.h"
#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace sdpa {
namespace {

std::atomic<int64_t> g_current_bytes{0};
// fail_allocation_after: successful allocations left before one fails; negative: none.
std::atomic<int64_t> g_allocations_before_fault{-1};
std::atomic<int64_t> g_peak_bytes{0};

void count_allocation(int64_t nbytes) {
  const int64_t now = g_current_bytes.fetch_add(nbytes) + nbytes;
  int64_t peak = g_peak_bytes.load();
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

// Whether this allocation is the one fail_allocation_after chose (one relaxed load
// otherwise).
bool injected_fault() {
  if (g_allocations_before_fault.load(std::memory_order_relaxed) < 0) return false;
  return g_allocations_before_fault.fetch_sub(1, std::memory_order_relaxed) == 0;
}

}  // namespace

namespace detail {
void fail_allocation_after(int64_t allocations) {
  g_allocations_before_fault.store(allocations < 0 ? -1 : allocations);
}
}  // namespace detail

std::shared_ptr<Storage> Storage::allocate(size_t nbytes) {
  // The ceiling (at most half the address space) also keeps the rounding below (and the
  // block cache's) from wrapping to a tiny block.
  const detail::MemoryCeiling& ceiling = detail::memory_ceiling();
  SDPA_CHECK(nbytes <= ceiling.bytes, "out of memory: could not allocate ", nbytes,
             " bytes, more than the ", ceiling.bytes, " bytes of ", ceiling.source);
  // Blocks are whole multiples of the alignment.
  const size_t padded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  // What sdpa already holds counts too: a call whose outputs and scratch together exceed
  // the machine fails here, at the allocation that would cross the ceiling, instead of
  // being granted by overcommit and killed when its pages are touched. Cached free blocks
  // are given back first when they are what stands in the way.
  const size_t held = static_cast<size_t>(std::max<int64_t>(g_current_bytes.load(), 0));
  SDPA_CHECK(padded <= ceiling.bytes - std::min(held, ceiling.bytes),
             "out of memory: could not allocate ", nbytes, " bytes: sdpa holds ", held,
             " bytes of tensors already, and together they exceed the ", ceiling.bytes,
             " bytes of ", ceiling.source);
  // The cache holds at most kCacheLimit: its size (behind a lock) is read only when it
  // could matter.
  const bool near_ceiling = held + padded + detail::kCacheLimit > ceiling.bytes;
  if (near_ceiling && held + detail::cached_block_bytes() + padded > ceiling.bytes) {
    detail::empty_block_cache();
  }
  SDPA_CHECK(!injected_fault(), "out of memory: could not allocate ", nbytes,
             " bytes (injected by fail_allocation_after)");
  void* data = padded == 0 ? nullptr : detail::acquire_block(padded);
  SDPA_CHECK(padded == 0 || data != nullptr, "out of memory: could not allocate ", nbytes,
             " bytes");
  auto s = std::make_shared<Storage>(Key{});
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->owned_ = true;
  count_allocation(static_cast<int64_t>(padded));
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device,
                                       std::function<void()> release) {
  auto s = std::make_shared<Storage>(Key{});
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->release_ = std::move(release);
  return s;
}

Storage::~Storage() {
  if (owned_) {
    const size_t padded = (nbytes_ + kAlignment - 1) / kAlignment * kAlignment;
    detail::release_block(data_, padded);
    g_current_bytes.fetch_sub(static_cast<int64_t>(padded));
  } else if (release_) {
    release_();
  }
}

MemoryStats memory_stats() {
  return {g_current_bytes.load(), g_peak_bytes.load(),
          static_cast<int64_t>(detail::cached_block_bytes())};
}

void empty_cache() { detail::empty_block_cache(); }

void reset_peak_memory() { g_peak_bytes.store(g_current_bytes.load()); }

}  // namespace sdpa
