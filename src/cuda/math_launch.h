#pragma once
// Host side of a MATH launch on CUDA: the stream, the call's geometry and the dense mask
// on the device (a mask materialized on the host is copied over, broadcast dimensions
// kept broadcast).

#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/math_device.cuh"
#include "dispatch/backend_impl.h"
#include "sdpa/cuda.h"

namespace sdpa::cuda::math {

template <typename T>
View<T> view(const Tensor& t) {
  return {static_cast<const T*>(t.data_ptr()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

/// The call's bands as index bounds (every band in the sequence frame, at most kMaxBands:
/// the callers' checks ensure it).
inline Bands sequence_bands(const AttentionParams& p) {
  Bands b;
  for (const DiagonalBand& band : p.mask.bands) {
    b.offset[b.count] = band.alignment == DiagonalAlignment::kBottomRight ? p.kv_len - p.q_len : 0;
    b.left[b.count] = band.left.value_or(INT64_MAX);
    b.right[b.count] = band.right.value_or(INT64_MAX);
    ++b.count;
  }
  return b;
}

/// The call's dense mask as a device view (kind 0 when it has none). A mask on the host is
/// copied over with broadcast dimensions kept broadcast; `owner` keeps the copy alive until
/// the kernels reading it are queued.
inline DenseMask device_dense_mask(const AttentionParams& p, Tensor& owner) {
  if (p.mask.dense_kind == DenseMaskKind::kNone) return {};
  Tensor dense = p.mask.dense;
  if (dense.device().type == DeviceType::kCPU) {
    // Copy only what is stored: slice broadcast dimensions to one element, expand again.
    Tensor compact = dense;
    for (int64_t d = 0; d < 4; ++d) {
      if (compact.stride(d) == 0) compact = compact.slice(d, 0, 1);
    }
    dense = to_device(compact, p.device, p.stream).expand(dense.sizes());
  }
  owner = dense;
  // Biases materialized for half-precision calls come in float32 (with_materialized_bias).
  const int additive = dense.dtype() == p.dtype ? 2 : 3;
  return DenseMask{dense.data_ptr(), dense.stride(0),
                   dense.stride(1),  dense.stride(2),
                   dense.stride(3),  p.mask.dense_kind == DenseMaskKind::kBoolKeep ? 1 : additive};
}

struct Launch {
  explicit Launch(const AttentionParams& p) : stream(static_cast<cudaStream_t>(p.stream)) {
    geometry = Geometry{p.batch,
                        p.num_heads_q,
                        p.num_heads_kv,
                        p.q_len,
                        p.kv_len,
                        p.head_dim_qk,
                        p.head_dim_vo,
                        p.scale,
                        p.dropout.p,
                        static_cast<uint64_t>(p.dropout.p * 4294967296.0),
                        static_cast<uint32_t>(p.dropout.philox.seed),
                        static_cast<uint32_t>(p.dropout.philox.seed >> 32),
                        p.dropout.philox.offset,
                        sequence_bands(p)};
    mask = device_dense_mask(p, dense_owner);
  }

  /// Blocks for `rows` rows: one each, up to a grid the hardware takes in one launch.
  int grid(int64_t rows) const { return static_cast<int>(std::min<int64_t>(rows, 1 << 20)); }

  cudaStream_t stream;
  Geometry geometry{};
  DenseMask mask;
  Tensor dense_owner;  // keeps a copied mask alive until the kernels are queued
};

}  // namespace sdpa::cuda::math
