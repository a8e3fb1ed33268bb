#pragma once
// Device copies used by the backends (the public ones are in include/sdpa/cuda.h).

#include "sdpa/tensor.h"

namespace sdpa::cuda::detail {

/// A copy of 4-D device tensor `t` whose rows start every `align_bytes` bytes: dims
/// t's, strides [.., .., pitch, 1] with the row pitch rounded up (the padding is
/// unwritten). For kernels that load rows with wide vector loads (cuDNN's bias).
Tensor copy_with_aligned_rows(const Tensor& t, size_t align_bytes, void* stream);

}  // namespace sdpa::cuda::detail
