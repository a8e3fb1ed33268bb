// The records of backends this build does not contain (no CUDA / cuDNN toolkit was
// configured): their checks say so, so explain() and the no-backend error name the reason.

#include "dispatch/backend_impl.h"

namespace sdpa::detail {
namespace {

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
  r.add("tensors are on ", device_name(p.device), "; this backend needs CUDA tensors");
  return false;
}

constexpr NamedCheck kEfficientChecks[] = {{"built_with_cuda", check_built_with_cuda},
                                           {"cuda_device", check_cuda_device}};
constexpr NamedCheck kCudnnChecks[] = {{"built_with_cudnn", check_built_with_cudnn},
                                       {"cuda_device", check_cuda_device}};

}  // namespace

const BackendImpl kEfficientBackend{SDPBackend::EFFICIENT_ATTENTION, kEfficientChecks, nullptr,
                                    nullptr, false};
const BackendImpl kCudnnBackend{SDPBackend::CUDNN_ATTENTION, kCudnnChecks, nullptr, nullptr,
                                false};

}  // namespace sdpa::detail
