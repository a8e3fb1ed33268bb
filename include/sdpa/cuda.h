#pragma once
// CUDA tensors: availability, device memory from CUDA's stream-ordered allocator, copies
// between host and device, and the cuDNN graph cache's counters. Every function exists in
// every build; without CUDA support they report it (is_built() is false, the others throw
// sdpa::Error saying so).

#include <cstdint>
#include <string>

#include "sdpa/tensor.h"

namespace sdpa::cuda {

/// A cudaStream_t, kept opaque so this header needs no CUDA headers. Null is the legacy
/// default stream (what PyTorch calls the default stream of the current device).
using Stream = void*;

/// Whether this library was built with CUDA (CMake option SDPA_CUDA).
bool is_built();
/// Whether the CUDNN_ATTENTION backend was built (SDPA_CUDNN: cuDNN 9 and its frontend).
bool cudnn_is_built();
/// Number of CUDA devices this process can use: 0 without a CUDA build, a driver or a GPU.
int device_count();
/// device_count() > 0.
bool is_available();
/// Why is_available() is false ("" when it is true): what a skipped test prints.
std::string unavailable_reason();
/// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, driver 13.0, cuDNN 9.19.0)".
std::string device_description(int device = 0);

/// Allocates an uninitialized contiguous tensor on CUDA device `device`, ordered on
/// `stream` (cudaMallocAsync from the device's default memory pool). The memory is freed
/// with cudaFreeAsync on the same stream when the last reference goes: work queued on
/// other streams that reads it must be ordered before that by the caller (as with
/// torch's record_stream). Throws sdpa::Error when out of memory or without a device.
Tensor empty(const Shape& shape, DType dtype, int device = 0, Stream stream = nullptr);
/// Returns `src` (any strides, on the CPU or a CUDA device) as a contiguous tensor of the
/// same dtype on `device`, copying on `stream`. A copy to the CPU waits for the stream,
/// so the host may read the result at once. Returns `src` itself when it already is a
/// contiguous tensor on `device`.
Tensor to_device(const Tensor& src, Device device, Stream stream = nullptr);
/// Blocks until the work queued on `stream` (of the current device) has finished.
void synchronize(Stream stream = nullptr);

/// Bytes of device memory held by sdpa's tensors and scratch on `device`: now and the
/// peak since the last reset_peak_memory(device). cached_bytes is unused (the pool of
/// cudaMallocAsync keeps freed memory; cudaMemPoolTrimTo returns it).
MemoryStats memory_stats(int device = 0);
void reset_peak_memory(int device = 0);

/// Counters of the cuDNN graph cache: graphs built for distinct call signatures are kept
/// (least recently used evicted beyond `capacity`); a hit skips graph building.
struct GraphCacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t size = 0;
  int64_t capacity = 0;
};
GraphCacheStats cudnn_graph_cache_stats();

/// The run-time compiler of flex programs for the CUDA kernels, the folder where compiled
/// code is kept by program hash and the CUDA headers its units include ("NVRTC (...);
/// cache <folder>; CUDA headers <folder>"), or that CUDA is not built. Loads nothing.
std::string runtime_compiler_description();

}  // namespace sdpa::cuda
