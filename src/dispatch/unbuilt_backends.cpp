// The record of EFFICIENT_ATTENTION, which sdpa does not implement (PyTorch's
// memory-efficient CUDA kernel; CUDNN_ATTENTION and FLASH_ATTENTION serve CUDA): its
// checks say so, so explain() and the no-backend error name the reason.

#include "dispatch/backend_impl.h"

namespace sdpa::detail {
namespace {

bool check_implemented(const AttentionParams&, Reasons& r) {
  r.add("sdpa has no EFFICIENT_ATTENTION kernels (CUDNN_ATTENTION, FLASH_ATTENTION and MATH serve CUDA tensors)");
  return false;
}

constexpr NamedCheck kEfficientChecks[] = {{"implemented", check_implemented}};

}  // namespace

const BackendImpl kEfficientBackend{SDPBackend::EFFICIENT_ATTENTION, kEfficientChecks, nullptr,
                                    nullptr, false};

}  // namespace sdpa::detail
