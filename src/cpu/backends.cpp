// The records of the built-in kernels: MATH (the reference; CPU and CUDA) and
// FLASH_ATTENTION (the CPU kernels, and sdpa's own CUDA kernels in a CUDA build), their
// named checks and kernels.

#include <string>

#include "cpu/kernels.h"
#include "cuda/flash/flash.h"
#include "cuda/math.h"
#include "dispatch/backend_impl.h"
#include "sdpa/flex.h"

namespace sdpa::detail {
namespace {

// FLASH keeps a [block, head_dim] float32 tile of q, k, v and the output per thread; this
// bound keeps those tiles inside L2.
constexpr int64_t kFlashCpuMaxHeadDim = 1024;

// FLASH runs on the CPU, and on CUDA devices in a CUDA build (cuda_kernel says what those
// kernels take).
bool check_flash_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kCPU || p.device.type == DeviceType::kCUDA) return true;
  r.add("tensors are on ", device_name(p.device), "; this backend runs on cpu and cuda");
  return false;
}

bool check_flash_cuda_kernel(const AttentionParams& p, Reasons& r) {
  return p.device.type != DeviceType::kCUDA || cuda::flash_supports(p, r);
}

// MATH runs everywhere the library has kernels: the CPU, and CUDA devices in a CUDA build.
bool check_math_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kCPU) return true;
  if (p.device.type == DeviceType::kCUDA) return cuda::math_supports(p, r);
  r.add("tensors are on ", device_name(p.device), "; MATH runs on cpu and cuda");
  return false;
}

bool check_flash_cpu_head_dim(const AttentionParams& p, Reasons& r) {
  if (p.device.type != DeviceType::kCPU) return true;  // cuda_kernel has the CUDA bounds
  if (p.head_dim_qk == 0 || p.head_dim_vo == 0) {
    r.add("head_dim 0: an empty dot product; MATH serves it");
    return false;
  }
  if (p.head_dim_qk <= kFlashCpuMaxHeadDim && p.head_dim_vo <= kFlashCpuMaxHeadDim) return true;
  if (r.collect) {
    r.add("head_dim ", std::to_string(p.head_dim_qk), "/", std::to_string(p.head_dim_vo),
          " exceeds ", std::to_string(kFlashCpuMaxHeadDim));
  }
  return false;
}

bool check_flash_cpu_mask_grad(const AttentionParams& p, Reasons& r) {
  if (!(p.backward && p.attn_mask_requires_grad)) return true;
  r.add("attn_mask requires grad: only MATH computes grad_attn_mask (as PyTorch)");
  return false;
}

// explain()'s account of a call's BlockMask: whether the backend skips blocks or masks
// every score per element.
std::string describe_math(const AttentionParams& p) {
  if (!p.mask.block_mask) return "";
  return "BlockMask: no block is skipped: every score is computed, then masked by its block "
         "(empty: masked, full: kept, partial: the mask_mod per element)";
}

std::string describe_flash(const AttentionParams& p) {
  const flex::BlockMask* m = p.mask.block_mask.get();
  if (m == nullptr) return "";
  int64_t partial = 0, full = 0;
  const int64_t rows = m->batch * m->num_heads * m->num_q_blocks();
  for (int64_t r = 0; r < rows; ++r) {
    partial += m->kv_num_blocks.data<int32_t>()[r];
    full += m->full_kv_num_blocks.data<int32_t>()[r];
  }
  return "BlockMask: key tiles in empty blocks are skipped, full blocks are kept without the "
         "mask_mod, the mask_mod runs per element in partial blocks; " +
         std::to_string(partial + full) + " of " + std::to_string(rows * m->num_kv_blocks()) +
         " blocks computed, " + std::to_string(partial) + " partial";
}

constexpr NamedCheck kMathChecks[] = {{"device", check_math_device}};
constexpr NamedCheck kFlashChecks[] = {{"device", check_flash_device},
                                       {"head_dim", check_flash_cpu_head_dim},
                                       {"mask_grad", check_flash_cpu_mask_grad},
                                       {"cuda_kernel", check_flash_cuda_kernel}};

}  // namespace

// MATH is the reference: it sees every bias as its dense materialize().
const BackendImpl kMathBackend{
    SDPBackend::MATH, kMathChecks, &cpu::math_forward,  &cpu::math_backward,  false,
    nullptr,          nullptr,     &cuda::math_forward, &cuda::math_backward, &describe_math};
const BackendImpl kFlashBackend{SDPBackend::FLASH_ATTENTION,
                                kFlashChecks,
                                &cpu::flash_forward,
                                &cpu::flash_backward,
                                true,
                                nullptr,
                                nullptr,
                                &cuda::flash_forward,
                                nullptr,
                                &describe_flash};

}  // namespace sdpa::detail
