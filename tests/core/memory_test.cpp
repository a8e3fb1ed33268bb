// memory_stats(): allocated storage is counted (now and peak), imported memory is not.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/memory_ceiling.h"
#include "sdpa/sdpa.h"
#include "sdpa/tensor.h"

namespace sdpa {
namespace {

using ::testing::HasSubstr;

TEST(MemoryStats, AllocationsAreCountedAndReleased) {
  const MemoryStats before = memory_stats();
  {
    const Tensor t = Tensor::empty({1024}, DType::kFloat32);
    const MemoryStats during = memory_stats();
    // 4096 bytes, possibly rounded up to the 64-byte alignment.
    EXPECT_GE(during.current_bytes - before.current_bytes, 4096);
    EXPECT_LT(during.current_bytes - before.current_bytes, 4096 + 64);
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    // Views and copies of the handle allocate nothing.
    const Tensor view = t.slice(0, 10, 20).unsqueeze(0).transpose(0, 1);
    const Tensor alias = t;  // NOLINT(performance-unnecessary-copy-initialization)
    EXPECT_EQ(memory_stats().current_bytes, during.current_bytes);
  }
  EXPECT_EQ(memory_stats().current_bytes, before.current_bytes);
}

TEST(MemoryStats, PeakAndReset) {
  reset_peak_memory();
  const MemoryStats base = memory_stats();
  EXPECT_EQ(base.peak_bytes, base.current_bytes);
  {
    const Tensor big = Tensor::zeros({1 << 20}, DType::kFloat64);  // 8 MiB
    const Tensor small = Tensor::zeros({100}, DType::kFloat16);
  }
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.current_bytes, base.current_bytes);
  EXPECT_GE(after.peak_bytes - base.current_bytes, (8 << 20) + 200);
  reset_peak_memory();
  EXPECT_EQ(memory_stats().peak_bytes, memory_stats().current_bytes);
}

TEST(MemoryStats, ImportedMemoryIsNotCounted) {
  std::vector<float> buf(1 << 16);
  const MemoryStats before = memory_stats();
  {
    const Tensor t = Tensor::from_blob(buf.data(), {1 << 16}, {1}, DType::kFloat32);
    EXPECT_EQ(memory_stats().current_bytes, before.current_bytes);
  }
  EXPECT_EQ(memory_stats().current_bytes, before.current_bytes);
}

TEST(MemoryStats, CopiesAndConversionsAllocateTheirResult) {
  const Tensor t = Tensor::zeros({64, 64}, DType::kFloat32);
  const MemoryStats before = memory_stats();
  {
    const Tensor h = t.to(DType::kBFloat16);
    EXPECT_GE(memory_stats().current_bytes - before.current_bytes, 64 * 64 * 2);
  }
  {
    const Tensor c = t.transpose(0, 1).contiguous();
    EXPECT_GE(memory_stats().current_bytes - before.current_bytes, 64 * 64 * 4);
  }
  EXPECT_EQ(memory_stats().current_bytes, before.current_bytes);
}

// An attention call frees all its scratch: only the returned tensors stay counted.
TEST(MemoryStats, AttentionCallsReleaseTheirScratch) {
  const Tensor q = Tensor::full({1, 2, 300, 64}, 0.5, DType::kFloat32);
  const Tensor k = Tensor::full({1, 2, 300, 64}, 0.25, DType::kFloat32);
  const Tensor v = Tensor::full({1, 2, 300, 64}, 1.0, DType::kFloat32);
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    sdpa_kernel guard(b);
    const MemoryStats before = memory_stats();
    {
      const AttentionResult r = scaled_dot_product_attention_with_lse(q, k, v);
      EXPECT_EQ(r.backend, b);
      EXPECT_GE(memory_stats().current_bytes - before.current_bytes, 300 * 64 * 2 * 4);
    }
    EXPECT_EQ(memory_stats().current_bytes, before.current_bytes) << backend_name(b);
  }
}

// FLASH never materializes the [L, S] scores (issue 2): its peak extra memory stays far
// below the score matrix.
TEST(MemoryStats, FlashDoesNotMaterializeTheScoreMatrix) {
  const int64_t l = 2048, s = 2048;
  const Tensor q = Tensor::full({1, 1, l, 64}, 0.01, DType::kFloat32);
  const Tensor k = Tensor::full({1, 1, s, 64}, 0.02, DType::kFloat32);
  const Tensor v = Tensor::full({1, 1, s, 64}, 1.0, DType::kFloat32);
  const int64_t scores_bytes = l * s * 4;  // 16 MiB
  sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  reset_peak_memory();
  const int64_t base = memory_stats().current_bytes;
  const Tensor out = scaled_dot_product_attention(q, k, v);
  const int64_t extra = memory_stats().peak_bytes - base;
  EXPECT_GE(extra, l * 64 * 4) << "the output itself is counted";
  EXPECT_LT(extra, scores_bytes / 4) << "FLASH peak extra memory " << extra;
}

// Out of memory is an sdpa::Error, not std::bad_alloc or a crash.
TEST(Storage, ImpossibleAllocationsThrowSdpaError) {
  EXPECT_THROW(Storage::allocate(size_t{1} << 62), Error);
  // Sizes whose rounding to the alignment (or to the block cache's 2 MiB) would wrap to a
  // tiny block.
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  for (size_t n : {kMax, kMax - 3, kMax - (size_t{2} << 20), kMax / 2 + 1}) {
    EXPECT_THROW(Storage::allocate(n), Error) << n;
  }
  EXPECT_THROW(Tensor::empty({int64_t{1} << 60}, DType::kFloat32), Error);
}

TEST(Storage, AllocateIsAlignedAndWrapReleasesOnce) {
  // Small blocks (under 2 MiB) are aligned by hand inside a malloc'd block: every byte
  // must be usable (the debug preset, built with AddressSanitizer, checks the writes).
  for (size_t n : {size_t{1}, size_t{63}, size_t{65}, size_t{4096}, (size_t{1} << 20) + 3}) {
    const auto s = Storage::allocate(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % kAlignment, 0u);
    std::memset(s->data(), 0x5a, n);
    EXPECT_GE(s->nbytes(), n);
    EXPECT_EQ(s->device(), Device{});
  }
  int released = 0;
  float buf[4] = {};
  {
    auto s = Storage::wrap(buf, sizeof(buf), Device{DeviceType::kCUDA, 2}, [&] { ++released; });
    EXPECT_EQ(s->data(), buf);
    EXPECT_EQ(s->nbytes(), sizeof(buf));
    EXPECT_EQ(s->device(), (Device{DeviceType::kCUDA, 2}));
    auto copy = s;
    s.reset();
    EXPECT_EQ(released, 0);
  }
  EXPECT_EQ(released, 1);
}

TEST(MemoryStats, LargeFreedBlocksAreCachedReusedAndEmptied) {
  empty_cache();
  ASSERT_EQ(memory_stats().cached_bytes, 0);
  const int64_t numel = (int64_t{3} << 20) / 4 + 5;  // just over 3 MiB of float32
  const void* first = nullptr;
  {
    Tensor big = Tensor::empty({numel}, DType::kFloat32);
    first = big.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (uintptr_t{2} << 20), 0u)
        << "large blocks are huge-page aligned";
  }
  EXPECT_EQ(memory_stats().cached_bytes, int64_t{4} << 20) << "rounded up to 2 MiB multiples";
  {
    const int64_t before = memory_stats().current_bytes;
    Tensor again = Tensor::empty({numel - 7}, DType::kFloat32);  // same rounded size
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(memory_stats().cached_bytes, 0);
    EXPECT_GE(memory_stats().current_bytes - before, (numel - 7) * 4)
        << "a reused block counts as allocated";
  }
  Tensor small = Tensor::empty({1000}, DType::kFloat32);
  small = Tensor();
  EXPECT_EQ(memory_stats().cached_bytes, int64_t{4} << 20) << "small blocks are not cached";
  empty_cache();
  EXPECT_EQ(memory_stats().cached_bytes, 0);
}

// A request beyond the memory ceiling fails at once with the bytes and the ceiling's
// source; without the ceiling, 2^44 bytes would be granted by overcommit and the block
// mask / scratch filling it would reach the OOM killer.
TEST(MemoryCeiling, LargerThanTheMachineIsAnError) {
  const detail::MemoryCeiling& ceiling = detail::memory_ceiling();
  EXPECT_GT(ceiling.bytes, size_t{1} << 24);
  try {
    (void)Tensor::empty({int64_t{1} << 42}, DType::kFloat32);
    FAIL() << "2^44 bytes were granted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("out of memory: could not allocate 17592186044416 bytes"));
    EXPECT_THAT(e.what(), HasSubstr(ceiling.source));
  }
  EXPECT_NO_THROW((void)Tensor::empty({1 << 20}, DType::kFloat32));
}

// Run by CTest with SDPA_MEMORY_LIMIT=64M (sdpa_core_memory_limit_env); skipped otherwise.
TEST(MemoryCeiling, EnvironmentLimitIsHonoured) {
  if (std::getenv("SDPA_MEMORY_LIMIT") == nullptr) GTEST_SKIP() << "SDPA_MEMORY_LIMIT unset";
  EXPECT_EQ(detail::memory_ceiling().bytes, size_t{64} << 20);
  EXPECT_EQ(detail::memory_ceiling().source, "SDPA_MEMORY_LIMIT");
  EXPECT_NO_THROW((void)Tensor::empty({16 << 20}, DType::kFloat32));
  try {
    (void)Tensor::empty({(16 << 20) + 1}, DType::kFloat32);
    FAIL() << "the limit was not applied";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("67108868 bytes, more than the 67108864 bytes of "
                                    "SDPA_MEMORY_LIMIT"));
  }
}

// Run with SDPA_MEMORY_LIMIT=64M: what sdpa already holds counts towards the ceiling, so
// allocations that fit one by one but not together fail at the one that crosses it.
TEST(MemoryCeiling, HeldTensorsCountTowardsIt) {
  if (std::getenv("SDPA_MEMORY_LIMIT") == nullptr) GTEST_SKIP() << "SDPA_MEMORY_LIMIT unset";
  empty_cache();
  Tensor held = Tensor::empty({10 << 20}, DType::kFloat32);  // 40 MiB
  try {
    (void)Tensor::empty({8 << 20}, DType::kFloat32);  // 32 MiB more
    FAIL() << "72 MiB were granted under a 64 MiB ceiling";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("could not allocate 33554432 bytes: sdpa holds"));
    EXPECT_THAT(e.what(), HasSubstr("exceed the 67108864 bytes of SDPA_MEMORY_LIMIT"));
  }
  held = Tensor();
  EXPECT_NO_THROW((void)Tensor::empty({8 << 20}, DType::kFloat32));
}

// An attention call whose buffers fit one by one but not together fails with the error
// and leaves nothing behind: MATH's per-thread copies of 2^19 broadcast keys and values
// (zero-stride inputs, no memory of their own) are 32 MiB each.
TEST(MemoryCeiling, AttentionWhoseScratchWouldCrossItIsAnError) {
  if (std::getenv("SDPA_MEMORY_LIMIT") == nullptr) GTEST_SKIP() << "SDPA_MEMORY_LIMIT unset";
  empty_cache();
  const int64_t before = memory_stats().current_bytes;
  {
    const Tensor q = Tensor::full({1, 1, 4, 16}, 0.01, DType::kFloat32);
    const Tensor kv = Tensor::full({1, 1, 1, 16}, 0.02, DType::kFloat32).expand({1, 1, 1 << 19, 16});
    sdpa_kernel math(SDPBackend::MATH);
    try {
      (void)scaled_dot_product_attention(q, kv, kv);
      FAIL() << "the call crossed the 64 MiB ceiling";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("sdpa holds"));
      EXPECT_THAT(e.what(), HasSubstr("SDPA_MEMORY_LIMIT"));
    }
  }
  EXPECT_EQ(memory_stats().current_bytes, before);
}

}  // namespace
}  // namespace sdpa
