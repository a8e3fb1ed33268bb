#pragma once
// Work-proportional threading: every parallel region of the CPU kernels asks a
// ThreadingContext how many threads its work repays, and runs on the calling thread alone
// (no OpenMP team, no worker woken) below the grain. Waking a worker costs microseconds
// on an idle machine and up to a scheduler time slice (milliseconds) on a busy one, where
// the worker waits for a core; a small call should not pay either (docs/design.md,
// "Threading").
//
// Regions are named by the function that holds them (flash_forward, merge_chunks, ...):
// OpenMP outlines each as <function>._omp_fn.N, so a profile reads.

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace sdpa::detail {

/// A region's work: the arithmetic it does and the bytes it streams from memory. A
/// compute-bound region (the flash tiles) is sized by its FLOPs, a memory-bound one (the
/// decode path, the merges and pre-passes) by its bytes.
struct Work {
  double flops = 0;
  double bytes = 0;
};

/// Work per thread below which a region does not wake another thread: about 25 us of one
/// thread's work, so a second thread is woken for regions of 50 us and more, where it
/// saves ~25 us against a fork/join of 1 us (workers spinning) to 5 us (passive wait).
/// Measured with `SDPA_GRAIN_SCALE=0 sdpa_small_calls grain` (docs/design.md,
/// "Threading"): one thread runs the small tile-path calls at 32-70 GFLOP/s and streams
/// k/v at 12 GB/s from memory, 45 GB/s from cache.
inline constexpr double kGrainFlops = 2.0e6;
inline constexpr double kGrainBytes = 5.0e5;

/// Regions of at least this many grains (about 100 ms of one thread's work) take the
/// whole budget even on a loaded machine: waiting up to a few time slices for a worker
/// costs them little, and each thread adds its fair share of the processors (a large call
/// on one thread would run about half as fast beside other busy processes).
inline constexpr double kLoadCapMaxGrains = 4000;

/// The thread budget of one library call: the most threads it may use, those worth
/// waking beside other processes, and the work grain. A value, taken once at the call's
/// entry, so that every region of the call sees the same budget.
class ThreadingContext {
 public:
  /// `grain_scale` multiplies kGrainFlops and kGrainBytes; 0 gives every region all the
  /// threads its items allow. `threads_beside_load` (at most max_threads) bounds regions
  /// below kLoadCapMaxGrains.
  ThreadingContext(int max_threads, double grain_scale, int threads_beside_load)
      : max_threads_(std::max(max_threads, 1)),
        threads_beside_load_(std::clamp(threads_beside_load, 1, max_threads_)),
        grain_scale_(grain_scale) {}
  ThreadingContext(int max_threads, double grain_scale)
      : ThreadingContext(max_threads, grain_scale, max_threads) {}

  /// The budget of a call starting on the calling thread: sdpa::get_num_threads() threads,
  /// one for small regions while other processes keep the processors busy (a worker
  /// recently started its region late: note_worker_start), and the process's grain scale
  /// (SDPA_GRAIN_SCALE, default 1; 0 also ignores late workers).
  static ThreadingContext current();

  int max_threads() const { return max_threads_; }

  /// Threads for a region of `items` independent work items doing `work` in all:
  /// min(budget, items, work / grain), at least 1 (serial, on the calling thread); below
  /// kLoadCapMaxGrains the budget is threads_beside_load.
  int threads_for(int64_t items, Work work) const {
    double limit = std::min(static_cast<double>(max_threads_), static_cast<double>(items));
    if (grain_scale_ > 0) {
      const double grains = std::max(work.flops / (grain_scale_ * kGrainFlops),
                                     work.bytes / (grain_scale_ * kGrainBytes));
      limit = std::min(limit, grains);
      if (grains < kLoadCapMaxGrains) {
        limit = std::min(limit, static_cast<double>(threads_beside_load_));
      }
    }
    return std::max(1, static_cast<int>(limit));
  }

 private:
  int max_threads_;
  int threads_beside_load_;
  double grain_scale_;
};

/// Sets the process's grain scale (tests run small shapes on several threads with 0) and
/// returns the previous one.
double set_grain_scale(double scale);

/// Forgets sdpa::set_num_threads: calls follow OpenMP's thread count again (tests).
void clear_num_threads();

/// A worker that starts a region this much after the calling thread opened it waited for
/// a processor: other processes hold them. Waking an idle worker takes 1-50 us, up to
/// about 1 ms where its virtual processor sleeps (passive wait in a VM); one that must wait
/// for a scheduler time slice, several milliseconds.
inline constexpr int64_t kLateWorkerNs = 2'000'000;
/// How long a late worker keeps regions below kLoadCapMaxGrains on the calling thread.
/// After it, regions try their threads again: under sustained contention one slow region
/// per period.
inline constexpr int64_t kContendedNs = 1'000'000'000;

/// Monotonic nanoseconds.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Records a worker's start `late_ns` after its region opened (kLateWorkerNs).
void note_worker_start(int64_t late_ns);

/// Whether the calling thread has opened a region of `threads` threads before; records
/// that it now does. libgomp keeps a pool of workers per calling thread and creates them
/// in the first region that needs them, which starts them 3-4 ms late on the development
/// VM with the machine idle: not a sign of contention.
bool team_exists(int threads);

/// Forgets a late worker (tests).
void clear_contention();

/// Runs `region` (a callable holding orphaned `#pragma omp for` loops) on `threads`
/// threads: an OpenMP parallel region when threads > 1, else a plain call, whose loops then
/// run serially on the calling thread without creating a team (a one-thread team costs
/// about 1-2 us; an orphaned static loop nothing, a dynamic one a few hundred ns). Workers
/// report how late they started (note_worker_start).
template <typename Region>
void run_region(int threads, Region&& region) {
  if (threads <= 1) return region();
  const bool timed = team_exists(threads);
  const int64_t opened = now_ns();
#pragma omp parallel num_threads(threads)
  {
    if (timed && omp_get_thread_num() != 0) note_worker_start(now_ns() - opened);
    region();
  }
}

}  // namespace sdpa::detail
