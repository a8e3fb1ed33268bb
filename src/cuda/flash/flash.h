#pragma once
// FLASH_ATTENTION on CUDA tensors: sdpa's own tensor-core kernels (FlashAttention-2,
// Dao 2023) for float16 / bfloat16 on sm_80 and newer. The FLASH backend's record
// (src/cpu/backends.cpp) routes CUDA tensors here.

#include "dispatch/backend_impl.h"

namespace sdpa::cuda {

/// Largest head dim (E and Ev) the CUDA FLASH kernels take; both must be multiples of 8.
inline constexpr int64_t kFlashMaxHeadDim = 256;

/// Whether the CUDA FLASH kernels can run `params` (else adds every reason).
bool flash_supports(const AttentionParams& params, Reasons& reasons);

/// Forward: out [B, Hq, L, Ev] (params.dtype) and lse [B, Hq, L] (float32), contiguous on
/// the device, queued on params.stream. Masks from params.mask (bands, documents, padding,
/// ALiBi, dense); the checks in flash_supports hold.
void flash_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse);

}  // namespace sdpa::cuda
