#pragma once
// Device copies used by the backends (the public ones are in include/sdpa/cuda.h).

#include <cstring>
#include <vector>

#include "sdpa/cuda.h"
#include "sdpa/tensor.h"

namespace sdpa::cuda::detail {

/// The bytes of host vector `values` as a 1-D contiguous tensor of `dtype` (whose element
/// size divides sizeof(V)) on `device`, copied on `stream` as to_device copies a host tensor.
template <typename V>
Tensor vector_to_device(const std::vector<V>& values, DType dtype, Device device, void* stream) {
  const size_t bytes = values.size() * sizeof(V);
  Tensor host = Tensor::empty({static_cast<int64_t>(bytes / element_size(dtype))}, dtype);
  if (bytes > 0) std::memcpy(host.data_ptr(), values.data(), bytes);
  return to_device(host, device, stream);
}

/// A copy of 4-D device tensor `t` whose rows start every `align_bytes` bytes: dims
/// t's, strides [.., .., pitch, 1] with the row pitch rounded up (the padding is
/// unwritten). For kernels that load rows with wide vector loads (cuDNN's bias).
Tensor copy_with_aligned_rows(const Tensor& t, size_t align_bytes, void* stream);

}  // namespace sdpa::cuda::detail
