// CUDA availability and device descriptions.

#include <cuda_runtime_api.h>

#include <sstream>

#include "cuda/status.h"
#include "sdpa/cuda.h"

namespace sdpa::cuda {

bool is_built() { return true; }

int device_count() {
  int count = 0;
  // No driver or no GPU is an answer (zero devices), not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

bool is_available() { return device_count() > 0; }

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: ") + cudaGetErrorName(status) + " (" +
           cudaGetErrorString(status) + ")";
  }
  return count > 0 ? "" : "no CUDA device in this machine";
}

std::string device_description(int device) {
  cudaDeviceProp prop{};
  detail::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int driver = 0;
  detail::check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  std::ostringstream os;
  os << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount
     << " SMs, " << (prop.totalGlobalMem >> 20) << " MiB, driver " << driver / 1000 << '.'
     << driver % 1000 / 10 << ")";
  return os.str();
}

void synchronize(Stream stream) {
  detail::check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                "cudaStreamSynchronize");
}

}  // namespace sdpa::cuda
