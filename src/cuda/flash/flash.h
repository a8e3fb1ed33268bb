#pragma once
// FLASH_ATTENTION on CUDA tensors: sdpa's own tensor-core kernels (FlashAttention-2,
// Dao 2023) for float16 / bfloat16 on sm_80 and newer. The FLASH backend's record
// (src/cpu/backends.cpp) routes CUDA tensors here.

#include <string>

#include "dispatch/backend_impl.h"

namespace sdpa::cuda {

/// Largest head dim (E and Ev) the CUDA FLASH kernels take; both must be multiples of 8.
inline constexpr int64_t kFlashMaxHeadDim = 256;

/// Query rows per block of the CUDA FLASH forward, and keys per tile for head dims
/// (max of E and Ev) up to `head_dim` (forward_kernel.cuh's ForwardTile; forward.cu checks
/// that they agree).
inline constexpr int64_t kFlashBlockRows = 64;
constexpr int64_t flash_key_tile(int64_t head_dim) { return head_dim <= 128 ? 64 : 32; }

/// The compute capability of CUDA device `device` as major * 10 + minor (0 when unknown),
/// read once per device.
int compute_capability(int device);

/// "" when flex units can be compiled here (NVRTC loads and the CUDA headers are found),
/// else why not.
std::string flex_flash_unavailable();

/// Whether the CUDA FLASH kernels can run `params` (else adds every reason).
bool flash_supports(const AttentionParams& params, Reasons& reasons);

/// Forward: out [B, Hq, L, Ev] (params.dtype) and lse [B, Hq, L] (float32), contiguous on
/// the device, queued on params.stream. Masks from params.mask (bands, documents, padding,
/// ALiBi, dense); the checks in flash_supports hold.
void flash_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse);

namespace flash {
struct ForwardArgs;
}

/// The forward of a call with a flex score_mod and / or BlockMask: the NVRTC unit of the
/// kernel with the score_mod and the BlockMask's mask_mod (cuda/flash/flex_unit.h) for
/// params.dtype and head-dim tile `head_dim_tile`, compiled (or found in the cache) for
/// the device, launched with `args` (prepared by flash_forward). The BlockMask's lists
/// drive tile skipping: each block of query rows visits only the kv blocks its q block
/// lists, and runs the mask_mod only on partial ones. Captured host tensors and the lists
/// are copied to the device for the call; an out-of-range captured read or an integer
/// division by zero in a program is an sdpa::Error after the launch (which then waits for
/// the stream).
void flex_flash_forward(const AttentionParams& params, flash::ForwardArgs args, int head_dim_tile);

}  // namespace sdpa::cuda
