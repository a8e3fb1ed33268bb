#pragma once
// Device-side pieces shared by the MATH kernels on CUDA: strided element access, the
// call's geometry, the mask, block reductions and Philox dropout.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/device_types.cuh"
#include "cuda/math.h"

namespace sdpa::cuda::math {

constexpr int kThreads = 128;  // one block per query row (or key row): keys in chunks of 128
constexpr int kMaxPerThread = 8;  // output elements per thread: head dims up to 1024
static_assert(kThreads * kMaxPerThread == kMathMaxHeadDim);

/// Elements of a chunk of kThreads starting at `first` of `count`.
__device__ inline int chunk_size(int64_t first, int64_t count) {
  return count - first < kThreads ? static_cast<int>(count - first) : kThreads;
}

template <typename T> struct Accumulator { using type = float; };
template <> struct Accumulator<double> { using type = double; };

__device__ inline double to_acc(double x) { return x; }

template <typename T> __device__ inline T from_acc(float x);
template <> __device__ inline __half from_acc<__half>(float x) { return __float2half_rn(x); }
template <> __device__ inline __nv_bfloat16 from_acc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ inline float from_acc<float>(float x) { return x; }
template <typename T> __device__ inline T from_acc(double x) { return static_cast<T>(x); }

/// A 4-D strided view [B, H, rows, cols] in elements.
template <typename T>
struct View {
  const T* data;
  int64_t s0, s1, s2, s3;
  __device__ const T* row(int64_t b, int64_t h, int64_t r) const {
    return data + b * s0 + h * s1 + r * s2;
  }
};

/// Whether key j is inside every band for query row i.
__device__ inline bool in_bands(const Bands& bands, int64_t i, int64_t j) {
  for (int n = 0; n < bands.count; ++n) {
    const int64_t diag = i + bands.offset[n];
    // j - diag compared with the bounds: no overflow for sizes below 2^62.
    if (bands.left[n] != INT64_MAX && j - diag < -bands.left[n]) return false;
    if (bands.right[n] != INT64_MAX && j - diag > bands.right[n]) return false;
  }
  return true;
}

/// Sizes and constants of one call.
struct Geometry {
  int64_t batch, heads_q, heads_kv, q_len, kv_len, head_dim, head_dim_v;
  double scale;
  // Dropout: probability, keep threshold over 2^32, Philox key and offset.
  double dropout_p;
  uint64_t threshold;
  uint32_t key0, key1;
  uint64_t offset;
  Bands bands;
  __host__ __device__ int64_t group() const { return heads_q / heads_kv; }
};

/// Score `s` of (b, h, i, j) masked: -inf outside a band, plus the dense mask's term.
template <typename T, typename Acc>
__device__ inline Acc apply_mask(Acc s, const DenseMask& m, const Bands& bands, int64_t b,
                                 int64_t h, int64_t i, int64_t j) {
  if (!in_bands(bands, i, j)) return Acc(-INFINITY);
  if (m.kind == 0) return s;
  const int64_t at = b * m.s0 + h * m.s1 + i * m.s2 + j * m.s3;
  if (m.kind == 1) {
    return static_cast<const bool*>(m.data)[at] ? s : Acc(-INFINITY);
  }
  if (m.kind == 3) return s + Acc(static_cast<const float*>(m.data)[at]);
  return s + to_acc(static_cast<const T*>(m.data)[at]);
}

/// Ten rounds of Philox4x32 (Salmon et al., SC 2011): the CPU kernels' generator.
__device__ inline uint4 philox4x32_10(uint4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

/// The dropout factor of element n of [B, Hq, L, S] (CPU layout: word n % 4 of the Philox
/// block at counter (n / 4, offset)): 0 when dropped, 1 / (1 - p) when kept.
template <typename Acc>
__device__ inline Acc dropout_factor(const Geometry& g, uint64_t n) {
  const uint64_t block = n >> 2;
  const uint4 w = philox4x32_10(make_uint4(static_cast<uint32_t>(block),
                                           static_cast<uint32_t>(block >> 32),
                                           static_cast<uint32_t>(g.offset),
                                           static_cast<uint32_t>(g.offset >> 32)),
                                g.key0, g.key1);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  return words[n & 3] >= g.threshold ? Acc(1.0 / (1.0 - g.dropout_p)) : Acc(0);
}

/// max that keeps NaN (a NaN score makes the row NaN, as on the CPU).
template <typename Acc>
__device__ inline Acc nan_max(Acc a, Acc b) {
  return (a != a || a > b) ? a : b;
}

/// Block-wide reductions over kThreads threads; `scratch` holds kThreads / 32 values.
template <typename Acc>
__device__ inline Acc block_max(Acc v, Acc* scratch) {
  for (int o = 16; o > 0; o /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  Acc r = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) r = nan_max(r, scratch[w]);
  return r;
}

template <typename Acc>
__device__ inline Acc block_sum(Acc v, Acc* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  Acc r = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) r += scratch[w];
  return r;
}

/// Dot product of a row cached in shared memory with a strided global row.
template <typename T, typename Acc>
__device__ inline Acc dot(const Acc* cached, const T* row, int64_t stride, int64_t n) {
  Acc s = 0;
  for (int64_t e = 0; e < n; ++e) s += cached[e] * to_acc(row[e * stride]);
  return s;
}

}  // namespace sdpa::cuda::math
