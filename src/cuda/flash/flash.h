#pragma once
// FLASH_ATTENTION on CUDA tensors: sdpa's own tensor-core kernels (FlashAttention-2,
// Dao 2023) for float16 / bfloat16 on sm_80 and newer. The FLASH backend's record
// (src/cpu/backends.cpp) routes CUDA tensors here.

#include <string>

#include "dispatch/backend_impl.h"

namespace sdpa::cuda {

/// Largest head dim (E and Ev) the CUDA FLASH kernels take; both must be multiples of 8.
inline constexpr int64_t kFlashMaxHeadDim = 256;

/// The compute capability of CUDA device `device` as major * 10 + minor (0 when unknown),
/// read once per device.
int compute_capability(int device);

/// Whether flex score_mods may run in the CUDA FLASH kernels: SDPA_CUDA_FLASH_FLEX=1,
/// until the path has run on a GPU (docs/cuda.md).
bool flex_flash_enabled();

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

/// The forward of a call with a flex score_mod: the NVRTC unit of the kernel with the
/// program (cuda/flash/flex_unit.h) for params.dtype and head-dim tile `head_dim_tile`,
/// compiled (or found in the cache) for the device, launched with `args` (prepared by
/// flash_forward). Captured host tensors are copied to the device for the call; an
/// out-of-range captured read or an integer division by zero in the program is an
/// sdpa::Error after the launch (which then waits for the stream).
void flex_flash_forward(const AttentionParams& params, flash::ForwardArgs args, int head_dim_tile);

}  // namespace sdpa::cuda
