#pragma once
// Turns CUDA runtime statuses into sdpa::Error naming the call that failed.

#include <cuda_runtime_api.h>

#include "sdpa/error.h"

namespace sdpa::cuda::detail {

/// Throws sdpa::Error "<call>: <CUDA's name and description of status>" unless success.
inline void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  // Clear the sticky "last error" so a later, unrelated check does not report it again.
  cudaGetLastError();
  sdpa::detail::throw_error(call, ": ", cudaGetErrorName(status), " (",
                            cudaGetErrorString(status), ")");
}

/// Checks the launch of the kernel just queued (configuration errors surface here).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

/// Makes `device` current for the guard's lifetime (CUDA's current device is per thread).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    changed_ = device != previous_;
    if (changed_) check(cudaSetDevice(device), "cudaSetDevice");
  }
  // Restores only what it changed: cudaSetDevice is a driver call on every call's path.
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

}  // namespace sdpa::cuda::detail
