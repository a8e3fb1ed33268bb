#pragma once
// CUDA FLASH's forward kernel with a flex program, as one NVRTC translation unit: the
// generated score_mod / mask_mod device functions (cuda/flex_codegen.h), the kernel's own
// sources (cuda/device_types.cuh, cuda/flash/key_tiles.cuh, cuda/flash/mma.cuh,
// cuda/flash/forward_kernel.cuh, embedded at build time) and an extern "C" entry point
// instantiating forward_body for one element type and head-dim tile with hooks that call the
// program. Compiled by compile_cubin (cuda/nvrtc.h) with the CUDA headers' folder
// (cuda_include_dir()) on the include path.

#include <string>

#include "cuda/nvrtc.h"
#include "sdpa/flex.h"
#include "sdpa/tensor.h"

namespace sdpa::cuda::flash {

/// The entry point every flex forward unit defines:
/// `extern "C" __global__ void sdpa_flex_flash_forward(const ForwardArgs)`, launched with
/// ForwardTile<head_dim_tile>::kThreads threads and forward_smem_bytes() of dynamic shared
/// memory per block of ForwardTile::kRows query rows, as forward_kernel.
inline constexpr const char* kFlexForwardEntry = "sdpa_flex_flash_forward";

/// The kernel sources as embedded at build time: device_types.cuh, key_tiles.cuh, mma.cuh
/// and forward_kernel.cuh in that order, each file's text as it is in src/cuda.
const char* flash_kernel_sources();

/// The unit for `score_mod` and `mask_mod` (either may be null: identity / keep all) on
/// element type `dtype` (float16 or bfloat16) and head-dim tile `head_dim_tile` (32, 64,
/// 128 or 256: E and Ev padded up to it). Scores reach score_mod as (q . k) * scale in
/// float32, after mask_mod kept the element (mask_mod runs in a BlockMask's partial blocks
/// only) and the row's key interval contained it, as in the CPU FLASH evaluator. Throws
/// sdpa::Error naming the argument for another dtype or tile.
std::string flex_forward_unit(const flex::Program* score_mod, const flex::Program* mask_mod,
                              DType dtype, int head_dim_tile);

/// flex_forward_unit(score_mod, mask_mod, dtype, head_dim_tile) compiled by compile_cubin
/// for compute capability `arch` with the CUDA headers' folder (cuda_include_dir() when the
/// unit first compiles) on the include path, kept for the process under the programs'
/// structural hashes (flex::Program::structural_hash: operations, constants, captured
/// tensors' dtypes and shapes). After the first call for a structure, a re-traced program
/// of that structure is a map lookup: no unit text is built or hashed and no CUBIN copied.
/// Throws as flex_forward_unit and compile_cubin.
const CompiledModule& flex_forward_module(const flex::Program* score_mod,
                                          const flex::Program* mask_mod, DType dtype,
                                          int head_dim_tile, int arch);

}  // namespace sdpa::cuda::flash
