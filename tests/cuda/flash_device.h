#pragma once
// Whether this machine can run the CUDA FLASH tests: a CUDA device of sm_80 or newer.

#include <cuda_runtime_api.h>

#include <string>

#include "sdpa/cuda.h"

namespace sdpa_test {

/// "" when device 0 runs the CUDA FLASH kernels, else why the tests skip.
inline std::string cuda_flash_skip_reason() {
  if (!sdpa::cuda::is_available()) return sdpa::cuda::unavailable_reason();
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major < 8 ? "FLASH on CUDA needs sm_80 or newer" : "";
}

}  // namespace sdpa_test
