// The named checks of every backend and the backend table.

#include <string>

#include "cpu/kernels.h"
#include "dispatch/backend_impl.h"
#include "registry/registry_impl.h"

namespace sdpa::detail {
namespace {

// FLASH keeps a [block, head_dim] float32 tile of q, k, v and the output per thread; this
// bound keeps those tiles inside L2.
constexpr int64_t kFlashCpuMaxHeadDim = 1024;

std::string on(const AttentionParams& p) { return device_name(p.device); }

bool check_cpu_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kCPU) return true;
  r.add("tensors are on " + on(p) + "; this backend runs on cpu");
  return false;
}

bool check_flash_cpu_dtype(const AttentionParams& p, Reasons& r) {
  if (p.dtype != DType::kFloat64) return true;
  r.add("dtype float64 is not supported (FLASH computes in float32; MATH serves float64)");
  return false;
}

bool check_flash_cpu_head_dim(const AttentionParams& p, Reasons& r) {
  if (p.head_dim_qk <= kFlashCpuMaxHeadDim && p.head_dim_vo <= kFlashCpuMaxHeadDim) return true;
  r.add("head_dim " + std::to_string(p.head_dim_qk) + "/" + std::to_string(p.head_dim_vo) +
        " exceeds " + std::to_string(kFlashCpuMaxHeadDim));
  return false;
}

bool check_flash_cpu_mask_grad(const AttentionParams& p, Reasons& r) {
  if (!(p.backward && p.attn_mask_requires_grad)) return true;
  r.add("attn_mask requires grad: only MATH computes grad_attn_mask (as PyTorch)");
  return false;
}

bool check_built_with_cuda(const AttentionParams&, Reasons& r) {
  r.add("sdpa was built without CUDA support");
  return false;
}

bool check_built_with_cudnn(const AttentionParams&, Reasons& r) {
  r.add("sdpa was built without cuDNN support");
  return false;
}

bool check_cuda_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kCUDA) return true;
  r.add("tensors are on " + on(p) + "; this backend needs CUDA tensors");
  return false;
}

bool check_external_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kExternal) return true;
  r.add("tensors are on " + on(p) + "; OVERRIDEABLE serves tensors on an external device");
  return false;
}

constexpr NamedCheck kMathChecks[] = {{"cpu_device", check_cpu_device}};
constexpr NamedCheck kFlashChecks[] = {{"cpu_device", check_cpu_device},
                                       {"dtype", check_flash_cpu_dtype},
                                       {"head_dim", check_flash_cpu_head_dim},
                                       {"mask_grad", check_flash_cpu_mask_grad}};
constexpr NamedCheck kEfficientChecks[] = {{"built_with_cuda", check_built_with_cuda},
                                           {"cuda_device", check_cuda_device}};
constexpr NamedCheck kCudnnChecks[] = {{"built_with_cudnn", check_built_with_cudnn},
                                       {"cuda_device", check_cuda_device}};
// The external device's backend comes from the registry (src/registry): registered at run
// time, usually by a plugin, with its own checks.
constexpr NamedCheck kOverrideableChecks[] = {
    {"external_device", check_external_device},
    {"backend_registered", registry::check_external_backend_registered},
    {"backend_checks", registry::check_external_backend_checks}};

const BackendImpl kBackends[] = {
    // MATH is the reference: it sees every bias as its dense materialize().
    {SDPBackend::MATH, kMathChecks, &cpu::math_forward, &cpu::math_backward, false},
    {SDPBackend::FLASH_ATTENTION, kFlashChecks, &cpu::flash_forward, &cpu::flash_backward, true},
    {SDPBackend::EFFICIENT_ATTENTION, kEfficientChecks, nullptr, nullptr, false},
    {SDPBackend::CUDNN_ATTENTION, kCudnnChecks, nullptr, nullptr, false},
    {SDPBackend::OVERRIDEABLE, kOverrideableChecks, nullptr, nullptr, false},
};

}  // namespace

const BackendImpl& backend_impl(SDPBackend backend) {
  for (const BackendImpl& b : kBackends) {
    if (b.id == backend) return b;
  }
  throw Error("backend: " + std::string(backend_name(backend)) + " has no implementation");
}

bool run_checks(const BackendImpl& impl, const AttentionParams& params, Reasons& reasons) {
  bool ok = true;
  for (const NamedCheck& check : impl.checks) {
    if (!check.fn(params, reasons)) {
      ok = false;
      if (!reasons.collect) break;
    }
  }
  return ok;
}

}  // namespace sdpa::detail
