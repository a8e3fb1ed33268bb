#pragma once
// Thread counts in tests. Test shapes are small, below the work grain, where every region
// would run on one thread whatever the count: a scope that sets a count also sets the
// grain scale to 0, so each region takes every thread its work items allow.

#include <omp.h>

#include "core/threading.h"

namespace sdpa::test {

/// Runs the library's calls in this scope on `threads` threads with every region parallel;
/// restores the thread count and the grain on exit.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads)
      : saved_threads_(omp_get_max_threads()), saved_scale_(detail::set_grain_scale(0)) {
    omp_set_num_threads(threads);
  }
  ~ScopedThreads() {
    omp_set_num_threads(saved_threads_);
    detail::set_grain_scale(saved_scale_);
  }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_threads_;
  double saved_scale_;
};

}  // namespace sdpa::test
