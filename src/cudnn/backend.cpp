// The CUDNN_ATTENTION backend's record: named checks (device, then what sdpa can lower,
// then cuDNN's own verdict on the built graph) and its kernels.

#include <cuda_runtime_api.h>

#include "cudnn/forward.h"
#include "cudnn/graph_cache.h"
#include "cudnn/handle.h"
#include "cudnn/score_mod_graph.h"
#include "cuda/status.h"
#include "sdpa/cuda.h"

namespace sdpa {
namespace cuda {

bool cudnn_is_built() { return true; }

}  // namespace cuda

namespace detail {
namespace {

bool check_cuda_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kCUDA) return true;
  r.add("tensors are on ", device_name(p.device), "; this backend needs CUDA tensors");
  return false;
}

bool check_cudnn_library(const AttentionParams&, Reasons& r) {
  if (cudnn::cudnn_load_error().empty()) return true;
  r.add(cudnn::cudnn_load_error());
  return false;
}

bool check_lowering(const AttentionParams& p, Reasons& r) {
  cudnn::GraphSpec spec;
  return cudnn::lower(p, spec, r);
}

// cuDNN decides the rest (SM architecture, library version, head dims per arch, sizes):
// the graph is built (once per call signature, cached) and its verdict is the reason.
bool check_graph(const AttentionParams& p, Reasons& r) {
  cudnn::GraphSpec spec;
  cudnn::ScoreModCall score_mod;
  Reasons quiet{false, {}};
  if (!cudnn::lower(p, spec, quiet, &score_mod)) return false;
  if (!cudnn::cudnn_load_error().empty()) return false;
  try {
    cuda::detail::DeviceGuard guard(p.device.index);
    const auto entry = cudnn::graph_for(
        spec, cudnn::handle_for(p.device.index, static_cast<cudaStream_t>(p.stream)),
        score_mod.graph);
    if (entry->graph != nullptr) return true;
    r.add(entry->error);
  } catch (const Error& e) {
    r.add(e.what());
  }
  return false;
}

// explain(): a flex score_mod as the cuDNN pointwise nodes it lowers to, or why not.
std::string describe(const AttentionParams& p) {
  if (!p.mask.score_mod) return "";
  cudnn::LoweredScoreMod lowered;
  Reasons reasons;
  if (!cudnn::lower_score_mod(*p.mask.score_mod, {p.batch, p.num_heads_q, p.q_len, p.kv_len},
                              lowered, reasons)) {
    std::string text = "score_mod cannot be lowered to cuDNN:";
    for (const std::string& reason : reasons.items) text += "\n  " + reason;
    return text;
  }
  return "score_mod as cuDNN pointwise nodes:\n" + lowered.to_string();
}

constexpr NamedCheck kCudnnChecks[] = {{"cuda_device", check_cuda_device},
                                       {"cudnn_library", check_cudnn_library},
                                       {"lowering", check_lowering},
                                       {"graph", check_graph}};

}  // namespace

const BackendImpl kCudnnBackend{SDPBackend::CUDNN_ATTENTION,
                                kCudnnChecks,
                                nullptr,
                                nullptr,
                                true,
                                nullptr,
                                nullptr,
                                &cudnn::forward,
                                &cudnn::backward,
                                &describe};

}  // namespace detail
}  // namespace sdpa
