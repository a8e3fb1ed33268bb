// Device memory for CUDA tensors from CUDA's stream-ordered allocator (cudaMallocAsync on
// the device's default pool, which caches freed blocks itself), with per-device counters.

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

#include "cuda/status.h"
#include "sdpa/cuda.h"

namespace sdpa::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct Counters {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
};
std::array<Counters, kMaxDevices> g_counters;

Counters& counters(int device) {
  SDPA_CHECK(device >= 0 && device < kMaxDevices, "device: expected a CUDA device index in [0, ",
             kMaxDevices, "), got ", device);
  return g_counters[static_cast<size_t>(device)];
}

}  // namespace

Tensor empty(const Shape& shape, DType dtype, int device, Stream stream) {
  const int64_t numel = checked_numel(shape);
  const size_t nbytes = static_cast<size_t>(numel) * element_size(dtype);
  Counters& c = counters(device);
  void* data = nullptr;
  if (nbytes > 0) {
    detail::DeviceGuard guard(device);
    const cudaError_t status =
        cudaMallocAsync(&data, nbytes, static_cast<cudaStream_t>(stream));
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      sdpa::detail::throw_error("out of memory: could not allocate ", nbytes,
                                " bytes on cuda:", device);
    }
    detail::check(status, "cudaMallocAsync");
    const int64_t now = c.current.fetch_add(static_cast<int64_t>(nbytes)) +
                        static_cast<int64_t>(nbytes);
    int64_t peak = c.peak.load();
    while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
    }
  }
  std::shared_ptr<void> owner(data, [nbytes, device, stream, &c](void* p) {
    if (p == nullptr) return;
    // A destructor cannot throw: a failed free (a context already torn down at exit)
    // only leaves the counters as they were.
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    if (cudaFreeAsync(p, static_cast<cudaStream_t>(stream)) == cudaSuccess) {
      c.current.fetch_sub(static_cast<int64_t>(nbytes));
    } else {
      cudaGetLastError();
    }
    cudaSetDevice(previous);
  });
  return Tensor::from_blob(data, shape, contiguous_strides(shape), dtype,
                           Device{DeviceType::kCUDA, device}, std::move(owner));
}

MemoryStats memory_stats(int device) {
  Counters& c = counters(device);
  return {c.current.load(), c.peak.load(), 0};
}

void reset_peak_memory(int device) {
  Counters& c = counters(device);
  c.peak.store(c.current.load());
}

}  // namespace sdpa::cuda
