// What the CUDA FLASH kernels accept (flash.h): float16 / bfloat16 on sm_80+, head dims
// multiples of 8 up to 256, rows 16-byte aligned with a contiguous last dimension, every
// native mask part, flex score_mods and BlockMasks (flex_launch.cu); no paged or float8
// caches, dropout or backward yet.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>

#include "cuda/flash/flash.h"
#include "cuda/status.h"
#include "sdpa/flex.h"

namespace sdpa::cuda {

int compute_capability(int device) {
  static std::array<std::atomic<int>, 64> cached{};
  if (device < 0 || device >= static_cast<int>(cached.size())) return 0;
  int cc = cached[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (cc != 0) return cc;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  cc = major * 10 + minor;
  cached[static_cast<size_t>(device)].store(cc, std::memory_order_relaxed);
  return cc;
}

namespace {

// Rows start on 16-byte boundaries and the last dimension is dense: the kernels copy
// 16-byte chunks.
bool rows_aligned(const Tensor& t) {
  const int64_t elements = 16 / static_cast<int64_t>(element_size(t.dtype()));
  if (t.stride(3) != 1) return false;
  for (int d = 0; d < 3; ++d) {
    if (t.stride(d) % elements != 0) return false;
  }
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace

bool flash_supports(const AttentionParams& p, Reasons& r) {
  bool ok = true;
  const auto refuse = [&](auto&&... parts) {
    r.add(parts...);
    ok = false;
  };
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) {
    refuse("dtype: FLASH on CUDA takes float16 and bfloat16, got ",
           std::string(dtype_name(p.dtype)), " (MATH serves it)");
  }
  if (const int cc = compute_capability(p.device.index); cc == 0) {
    refuse("device: the compute capability of cuda:", std::to_string(p.device.index),
           " cannot be read (no usable device); FLASH on CUDA needs sm_80 or newer");
  } else if (cc < 80) {
    refuse("device: FLASH on CUDA needs sm_80 or newer (tensor-core mma.m16n8k16), cuda:",
           std::to_string(p.device.index), " is sm_", std::to_string(cc));
  }
  const auto head_dim_ok = [](int64_t e) { return e >= 8 && e <= kFlashMaxHeadDim && e % 8 == 0; };
  if (!head_dim_ok(p.head_dim_qk) || !head_dim_ok(p.head_dim_vo)) {
    refuse("head_dim: FLASH on CUDA takes E and Ev that are multiples of 8 in [8, ",
           std::to_string(kFlashMaxHeadDim), "], got E = ", std::to_string(p.head_dim_qk),
           ", Ev = ", std::to_string(p.head_dim_vo));
  }
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  if (p.q_len >= kInt32 || p.kv_len >= kInt32 ||
      (p.q_len + kFlashBlockRows - 1) / kFlashBlockRows * p.batch * p.num_heads_q >= kInt32) {
    refuse("size: FLASH on CUDA indexes rows and blocks in int32");
  }
  if (ok && !(rows_aligned(p.q) && rows_aligned(p.k) && rows_aligned(p.v))) {
    refuse(
        "layout: FLASH on CUDA needs q, k and v with a contiguous last dimension and rows "
        "on 16-byte boundaries (strides multiples of 8 elements)");
  }
  if (p.mask.score_mod || p.mask.block_mask) {
    if (!p.mask.alibi_slopes.empty() || p.mask.dense_kind != DenseMaskKind::kNone) {
      refuse(
          "flex: a score_mod or BlockMask beside ALiBi or an attn_mask does not run in the CUDA "
          "FLASH kernels");
    } else if (const std::string why = flex_flash_unavailable(); !why.empty()) {
      refuse("flex: " + why);
    }
  }
  if (const flex::BlockMask* m = p.mask.block_mask.get(); m != nullptr && ok) {
    // A block of query rows lies in one q block, a key tile in one kv block (as torch's
    // flex kernels require of their tiles).
    const int64_t keys = flash_key_tile(std::max(p.head_dim_qk, p.head_dim_vo));
    if (m->q_block_size % kFlashBlockRows != 0 || m->kv_block_size % keys != 0) {
      refuse("block_mask: the CUDA FLASH kernels take BLOCK_SIZE multiples of (",
             std::to_string(kFlashBlockRows), ", ", std::to_string(keys),
             ") at this head dim, got (", std::to_string(m->q_block_size), ", ",
             std::to_string(m->kv_block_size), ")");
    }
  }
  if (p.kv_pages || p.kv_dequant) {
    refuse("kv_cache: paged and float8 KV caches do not run in the CUDA FLASH kernels yet");
  }
  if (p.has_dropout()) refuse("dropout: the CUDA FLASH kernels have no dropout yet");
  if (p.backward)
    refuse("backward: the CUDA FLASH kernels have no backward yet (cuDNN or MATH serves it)");
  return ok;
}

}  // namespace sdpa::cuda
