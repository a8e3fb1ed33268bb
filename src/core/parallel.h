#pragma once
// Exceptions may not leave an OpenMP region: workers record the first one here and the
// caller rethrows it after the region.

#include <exception>
#include <mutex>

namespace sdpa::detail {

class ParallelErrors {
 public:
  /// Call from a catch (...) block inside the region.
  void capture() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
  /// Call after the region.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex mutex_;
  std::exception_ptr error_;
};

}  // namespace sdpa::detail
