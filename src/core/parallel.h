#pragma once
// Exceptions may not leave an OpenMP region (std::terminate): workers record the first
// one here and the caller rethrows it after the region. A thread must not leave a region
// early either: the others would wait for it at the next loop's barrier. So a thread
// whose scratch could not be made still runs the region's loops, without doing their
// items (`if (scratch)`), and every thread skips the items after the first error.

#include <atomic>
#include <exception>
#include <mutex>

namespace sdpa::detail {

class ParallelErrors {
 public:
  /// Call from a catch (...) block inside the region.
  void capture() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
    failed_.store(true, std::memory_order_relaxed);
  }
  /// Runs `work` unless an error was recorded; records what it throws.
  template <class Work>
  void guard(Work&& work) {
    if (failed()) return;
    try {
      work();
    } catch (...) {
      capture();
    }
  }
  /// Whether an error was recorded: the call will throw, the rest of its work is moot.
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  /// Call after the region.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
  std::atomic<bool> failed_{false};
};

}  // namespace sdpa::detail
