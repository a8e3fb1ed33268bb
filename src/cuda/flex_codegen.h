#pragma once
// Flex programs as CUDA C++ device functions, for sdpa's own CUDA kernels (compiled at run
// time by NVRTC, cuda/nvrtc.h). The generated code computes what the CPU FLASH evaluator
// computes: float values in float32, integers in int64 with Python's floor division and
// modulo and torch's shifts, bools as 0/1; min / max as (a < b ? a : b); captured tensors
// read through their strides with every index bounds-checked. A device cannot throw: an
// out-of-range read or an integer division by zero records the first failure in the
// status the kernel passes (code, captured slot, dimension, index, b/h/q_idx/kv_idx) and
// yields 0, and the host raises sdpa::Error from it after the launch.
//
// Every function takes (score, b, h, q_idx, kv_idx, captured, status): score float,
// indices int64, captured the program's tensors (SdpaCapturedTensor, in Program::captured()
// order), status an SdpaFlexStatus*.

#include <cstdint>
#include <string>
#include <vector>

#include "sdpa/flex.h"

namespace sdpa::flex {
struct CompiledProgram;
}

namespace sdpa::cuda {

/// The shared definitions every generated unit starts with: SdpaCapturedTensor (data,
/// sizes, strides of up to 8 dimensions), SdpaFlexStatus, element loads of float32,
/// float16, bfloat16, int32, int64 and bool tensors, and the integer helpers.
const std::string& flex_prelude();

/// `__device__ RESULT name(...)` computing instruction `result` of `code` (and only the
/// instructions it reads): RESULT is float, long long or bool after the instruction's type.
/// `captured` are the tensors `code` reads, by slot (their dtypes select the loads).
std::string emit_device_function(const flex::CompiledProgram& code, int32_t result,
                                 const std::vector<flex::Captured>& captured,
                                 const std::string& name);

/// One translation unit for a call's programs: the prelude, then `sdpa_score_mod` (float;
/// the score itself without a score_mod), `sdpa_score_mod_grad` (d(score_mod)/d(score),
/// derived by flex/autodiff; 1 without a score_mod) when `with_gradient`, and
/// `sdpa_mask_mod` (bool; true without a mask_mod). Gradients of captured tensors are not
/// emitted. Throws sdpa::Error when the score_mod has no derivative (as the CPU backward).
std::string flex_translation_unit(const flex::Program* score_mod, const flex::Program* mask_mod,
                                  bool with_gradient);

}  // namespace sdpa::cuda
