// Compiled when the CUDNN_ATTENTION backend is not (no CUDA, cuDNN or cuDNN frontend was
// configured): its checks say so, so explain() and the no-backend error name the reason.

#include "dispatch/backend_impl.h"
#include "sdpa/cuda.h"

namespace sdpa {
namespace cuda {

bool cudnn_is_built() { return false; }
GraphCacheStats cudnn_graph_cache_stats() { return {}; }

}  // namespace cuda

namespace detail {
namespace {

bool check_built_with_cudnn(const AttentionParams&, Reasons& r) {
  r.add("sdpa was built without cuDNN support (configure with CUDA, cuDNN 9 and the cuDNN "
        "frontend: SDPA_CUDNN)");
  return false;
}

bool check_cuda_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kCUDA) return true;
  r.add("tensors are on ", device_name(p.device), "; this backend needs CUDA tensors");
  return false;
}

constexpr NamedCheck kCudnnChecks[] = {{"built_with_cudnn", check_built_with_cudnn},
                                       {"cuda_device", check_cuda_device}};

}  // namespace

const BackendImpl kCudnnBackend{SDPBackend::CUDNN_ATTENTION, kCudnnChecks, nullptr, nullptr,
                                false};

}  // namespace detail
}  // namespace sdpa
