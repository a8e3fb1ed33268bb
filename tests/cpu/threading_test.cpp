// Work-proportional threading (core/threading.h): the thread count each region gets,
// sdpa::set_num_threads, and results that do not depend on the thread count. No timings:
// those are in bench/small_calls.cpp.

#include "core/threading.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/harness.h"
#include "common/threads.h"

namespace sdpa::test {
namespace {

using detail::kGrainBytes;
using detail::kGrainFlops;
using detail::ThreadingContext;
using ::testing::HasSubstr;

TEST(Threading, SerialBelowTheGrain) {
  const ThreadingContext context(8, 1.0);
  EXPECT_EQ(context.threads_for(1000, {0.99 * kGrainFlops, 0}), 1);
  EXPECT_EQ(context.threads_for(1000, {0, 0.99 * kGrainBytes}), 1);
  EXPECT_EQ(context.threads_for(1000, {0, 0}), 1);
}

TEST(Threading, ThreadsGrowWithTheWork) {
  const ThreadingContext context(8, 1.0);
  EXPECT_EQ(context.threads_for(1000, {2.5 * kGrainFlops, 0}), 2);
  EXPECT_EQ(context.threads_for(1000, {0, 5.0 * kGrainBytes}), 5);
  // The larger of the two estimates decides.
  EXPECT_EQ(context.threads_for(1000, {3.0 * kGrainFlops, 1.0 * kGrainBytes}), 3);
  // A larger grain scale asks more work of each thread.
  EXPECT_EQ(ThreadingContext(8, 2.0).threads_for(1000, {5.0 * kGrainFlops, 0}), 2);
}

TEST(Threading, ThreadsCappedByItemsAndBudget) {
  const ThreadingContext context(8, 1.0);
  EXPECT_EQ(context.threads_for(3, {1e15, 1e15}), 3);
  EXPECT_EQ(context.threads_for(1, {1e15, 0}), 1);
  EXPECT_EQ(context.threads_for(0, {1e15, 0}), 1);
  EXPECT_EQ(context.threads_for(1000, {1e15, 0}), 8);
  // Grain scale 0: every region takes what its items and the budget allow.
  EXPECT_EQ(ThreadingContext(8, 0.0).threads_for(5, {0, 0}), 5);
  EXPECT_EQ(ThreadingContext(0, 1.0).max_threads(), 1);
}

TEST(Threading, LoadOfOtherProcessesTakesProcessors) {
  // Processors held by other processes bound small regions only.
  const ThreadingContext loaded(8, 1.0, 2);
  EXPECT_EQ(loaded.threads_for(1000, {100 * kGrainFlops, 0}), 2);
  EXPECT_EQ(loaded.threads_for(1000, {detail::kLoadCapMaxGrains * kGrainFlops, 0}), 8);
  EXPECT_EQ(ThreadingContext(8, 0.0, 2).threads_for(1000, {0, 0}), 8);
}

// Clears set_num_threads on exit, so other tests follow OpenMP's count again.
struct ClearNumThreads {
  ~ClearNumThreads() { detail::clear_num_threads(); }
};

// A worker that starts a region late (it waited for a processor) keeps the small regions
// of the next calls on the calling thread at once.
TEST(Threading, LateWorkerKeepsSmallRegionsOnTheCallingThread) {
  ClearNumThreads restore;
  set_num_threads(2);
  detail::clear_contention();
  const detail::Work small{100 * kGrainFlops, 0};
  const detail::Work large{detail::kLoadCapMaxGrains * kGrainFlops, 0};
  const int before = ThreadingContext::current().threads_for(1000, small);
  detail::note_worker_start(detail::kLateWorkerNs / 2);  // woken in time: no change
  EXPECT_EQ(ThreadingContext::current().threads_for(1000, small), before);
  detail::note_worker_start(2 * detail::kLateWorkerNs);
  EXPECT_EQ(ThreadingContext::current().threads_for(1000, small), 1);
  EXPECT_EQ(ThreadingContext::current().threads_for(1000, large), 2);
  detail::clear_contention();
  EXPECT_EQ(ThreadingContext::current().threads_for(1000, small), before);
}

TEST(Threading, OnlyRegionsOfAnExistingTeamAreTimed) {
  // libgomp creates a calling thread's workers in its first region that needs them; their
  // late start then is not contention. Each calling thread has its own pool.
  std::thread([] {
    EXPECT_TRUE(detail::team_exists(1));
    EXPECT_FALSE(detail::team_exists(3));
    EXPECT_TRUE(detail::team_exists(3));
    EXPECT_TRUE(detail::team_exists(2));
    EXPECT_FALSE(detail::team_exists(4));
  }).join();
  std::thread([] { EXPECT_FALSE(detail::team_exists(2)); }).join();
}

TEST(Threading, SetNumThreadsValidatesAndHoldsForEveryThread) {
  const ClearNumThreads clear;
  for (int bad : {0, -1}) {
    try {
      set_num_threads(bad);
      ADD_FAILURE() << "set_num_threads(" << bad << ") did not throw";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("set_num_threads: n: expected >= 1"));
    }
  }
  set_num_threads(3);
  EXPECT_EQ(get_num_threads(), 3);
  EXPECT_EQ(ThreadingContext::current().max_threads(), 3);
  // Process-wide: another thread sees it too, whatever its own OpenMP setting.
  int seen = 0;
  std::thread([&] {
    omp_set_num_threads(5);
    seen = get_num_threads();
  }).join();
  EXPECT_EQ(seen, 3);
}

TEST(Threading, FollowsOpenMPUntilSet) {
  const ClearNumThreads clear;
  const ScopedThreads scoped(2);
  EXPECT_EQ(get_num_threads(), 2);
}

// Runs with OMP_NUM_THREADS=3 in ctest's sdpa_threading_omp_num_threads.
TEST(Threading, EnvironmentThreadCount) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env == nullptr) GTEST_SKIP() << "OMP_NUM_THREADS is not set";
  EXPECT_EQ(get_num_threads(), std::atoi(env));
}

// Out and lse bits with `threads` threads, every region parallel.
AttentionResult run_on(int threads, const CaseInputs& in) {
  const ScopedThreads scoped(threads);
  return scaled_dot_product_attention_with_lse(in.q, in.k, in.v, in.options);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(),
                                               a.numel() * element_size(a.dtype())) == 0;
}

// Odd shapes (GQA, lengths and head sizes off the tile and vector widths), on the tile
// path and the decode path, FLASH and MATH: 1, 2, 3 and 7 threads give the same bits, and
// they match the float64 reference.
TEST(Threading, ResultsEqualForAnyThreadCount) {
  Case tile;
  tile.batch = 3;
  tile.heads_q = 6;
  tile.heads_kv = 3;
  tile.enable_gqa = true;
  tile.q_len = 67;
  tile.kv_len = 131;
  tile.head_dim = 24;
  tile.head_dim_v = 40;
  tile.causal = true;
  Case decode = tile;
  decode.q_len = 1;
  decode.kv_len = 1031;  // three 512-key chunks, the last one partial
  decode.causal = false;
  for (const Case& c : {tile, decode}) {
    const CaseInputs in = make_inputs(c);
    for (SDPBackend backend : {SDPBackend::FLASH_ATTENTION, SDPBackend::MATH}) {
      const sdpa_kernel only(backend);
      const AttentionResult one = run_on(1, in);
      EXPECT_TRUE(matches_reference(one.out, one.lse, in.ref, c.dtype, false)) << c.describe();
      for (int threads : {2, 3, 7}) {
        const AttentionResult many = run_on(threads, in);
        EXPECT_TRUE(same_bits(one.out, many.out) && same_bits(one.lse, many.lse))
            << backend_name(backend) << " " << c.describe() << ": " << threads << " threads";
      }
    }
  }
}

}  // namespace
}  // namespace sdpa::test
