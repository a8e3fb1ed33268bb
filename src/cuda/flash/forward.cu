// Host side of the CUDA FLASH forward: the launch arguments from AttentionParams (mask
// parts copied to the device where needed) and the head-dim tile for E / Ev.

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>

#include "cuda/copy.h"
#include "cuda/flash/flash.h"
#include "cuda/flash/forward_kernel.cuh"
#include "cuda/math_launch.h"
#include "cuda/row_intervals.h"
#include "cuda/status.h"
#include "sdpa/cuda.h"

namespace sdpa::cuda {
namespace flash {
namespace {

void strides_of(const Tensor& t, int64_t (&s)[3]) {
  for (int d = 0; d < 3; ++d) s[d] = t.stride(d);
}

template <typename T, int kHeadDim>
void launch(const ForwardArgs& args, int64_t batch_heads, cudaStream_t stream) {
  constexpr int kRows = ForwardTile<kHeadDim>::kRows;
  const int64_t blocks = (args.q_len + kRows - 1) / kRows * batch_heads;
  constexpr size_t smem = forward_smem_bytes<T, kHeadDim>();
  // From 48 KiB of shared memory (with the kernel's few static bytes) a kernel must opt in,
  // once per device.
  if constexpr (smem >= 48 * 1024) {
    static std::array<std::atomic<bool>, 64> opted_in{};
    int device = 0;
    detail::check(cudaGetDevice(&device), "cudaGetDevice");
    std::atomic<bool>& done = opted_in.at(static_cast<size_t>(device));
    if (!done.load(std::memory_order_acquire)) {
      detail::check(
          cudaFuncSetAttribute(forward_kernel<T, kHeadDim>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "cudaFuncSetAttribute (FLASH forward, shared memory)");
      done.store(true, std::memory_order_release);
    }
  }
  forward_kernel<T, kHeadDim>
      <<<static_cast<unsigned>(blocks), ForwardTile<kHeadDim>::kThreads, smem, stream>>>(args);
  detail::check_launch("FLASH forward kernel (cuda)");
}

static_assert(ForwardTile<64>::kRows == kFlashBlockRows &&
              ForwardTile<256>::kRows == kFlashBlockRows);
static_assert(ForwardTile<128>::kKeys == flash_key_tile(128) &&
              ForwardTile<256>::kKeys == flash_key_tile(256));

// The head-dim tile serving E and Ev: both are padded up to it.
int head_dim_tile(const ForwardArgs& args) {
  const int d = std::max(args.head_dim, args.head_dim_v);
  return d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 256;
}

template <typename T>
void launch_for_head_dim(const ForwardArgs& args, int64_t batch_heads, cudaStream_t stream) {
  switch (head_dim_tile(args)) {
    case 32:
      return launch<T, 32>(args, batch_heads, stream);
    case 64:
      return launch<T, 64>(args, batch_heads, stream);
    case 128:
      return launch<T, 128>(args, batch_heads, stream);
    default:
      return launch<T, 256>(args, batch_heads, stream);
  }
}

}  // namespace
}  // namespace flash

void flash_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  detail::DeviceGuard guard(p.device.index);
  flash::ForwardArgs a{};
  a.q = p.q.data_ptr();
  a.k = p.k.data_ptr();
  a.v = p.v.data_ptr();
  flash::strides_of(p.q, a.q_stride);
  flash::strides_of(p.k, a.k_stride);
  flash::strides_of(p.v, a.v_stride);
  a.out = out.data_ptr();
  a.lse = lse.data<float>();
  a.heads_q = p.num_heads_q;
  a.heads_kv = p.num_heads_kv;
  a.q_len = static_cast<int>(p.q_len);
  a.kv_len = static_cast<int>(p.kv_len);
  a.head_dim = static_cast<int>(p.head_dim_qk);
  a.head_dim_v = static_cast<int>(p.head_dim_vo);
  a.scale = static_cast<float>(p.scale);
  a.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);

  const MaskDescriptor& m = p.mask;
  Tensor row_lo, row_hi, slopes, dense_owner;  // alive until the kernel is queued
  if (needs_intervals(m) || m.bands.size() > static_cast<size_t>(math::kMaxBands)) {
    const RowIntervals rows = row_intervals(p);
    row_lo = detail::vector_to_device(rows.lo, DType::kInt32, p.device, p.stream);
    row_hi = detail::vector_to_device(rows.hi, DType::kInt32, p.device, p.stream);
    a.row_lo = row_lo.data<int32_t>();
    a.row_hi = row_hi.data<int32_t>();
    a.interval_batches = static_cast<int>(rows.batches);
  } else {
    a.bands = math::sequence_bands(p);
  }
  if (!m.alibi_slopes.empty()) {
    slopes = detail::vector_to_device(m.alibi_slopes, DType::kFloat32, p.device, p.stream);
    a.alibi_slopes = slopes.data<float>();
    a.alibi_offset = m.alibi_alignment == DiagonalAlignment::kBottomRight ? p.kv_len - p.q_len : 0;
  }
  a.dense = math::device_dense_mask(p, dense_owner);

  if (p.mask.score_mod || p.mask.block_mask)
    return flex_flash_forward(p, a, flash::head_dim_tile(a));
  const int64_t batch_heads = p.batch * p.num_heads_q;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (p.dtype == DType::kFloat16) {
    flash::launch_for_head_dim<__half>(a, batch_heads, stream);
  } else {
    flash::launch_for_head_dim<__nv_bfloat16>(a, batch_heads, stream);
  }
}

}  // namespace sdpa::cuda
