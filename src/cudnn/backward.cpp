// CUDNN_ATTENTION backward: cuDNN frontend's SDPA backward node, recomputing P from the
// forward's lse (FlashAttention-2's backward, Dao 2023). Deterministic when
// use_deterministic_algorithms is on.

#include <unordered_map>

#include "cudnn/forward.h"
#include "cudnn/graph_build.h"
#include "cudnn/graph_cache.h"
#include "cudnn/handle.h"
#include "cudnn/score_mod_graph.h"
#include "cuda/status.h"

namespace sdpa::cudnn {
namespace {

std::array<int64_t, 4> contiguous(const std::array<int64_t, 4>& d) {
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

}  // namespace

std::shared_ptr<fe::graph::Graph> backward_graph(
    const GraphSpec& spec, const std::shared_ptr<const ScoreModGraph>& score_mod,
    int sm_version) {
  auto [graph, q, k, v] = new_graph(spec, sm_version);
  auto out = tensor(*graph, "out", kOut, spec.out);
  auto grad_out = tensor(*graph, "grad_out", kGradOut, spec.grad_out);
  auto lse = tensor(*graph, "lse", kLse, spec.lse);
  lse->set_data_type(fe::DataType_t::FLOAT);
  auto attributes = fe::graph::SDPA_backward_attributes()
                        .set_name("sdpa_backward")
                        .set_deterministic_algorithm(spec.deterministic != 0);
  apply_mask(*graph, spec, attributes);
  if (score_mod != nullptr) set_score_mod(*graph, attributes, score_mod);
  auto [grad_q, grad_k, grad_v] = graph->sdpa_backward(q, k, v, out, grad_out, lse, attributes);
  const auto set = [](auto& t, int64_t uid, const TensorSpec& like) {
    t->set_output(true).set_uid(uid).set_dim({like.dims.begin(), like.dims.end()});
    const auto strides = contiguous(like.dims);
    t->set_stride({strides.begin(), strides.end()});
  };
  set(grad_q, kGradQ, spec.q);
  set(grad_k, kGradK, spec.k);
  set(grad_v, kGradV, spec.v);
  return graph;
}

std::shared_ptr<fe::graph::Graph> build_backward_graph(
    const GraphSpec& spec, cudnnHandle_t handle,
    const std::shared_ptr<const ScoreModGraph>& score_mod) {
  auto graph = backward_graph(spec, score_mod);
  finish(*graph, handle, spec);
  return graph;
}

void backward(const AttentionParams& p, sdpa::detail::BackwardOutputs& o) {
  cuda::detail::DeviceGuard guard(p.device.index);
  cudnnHandle_t handle = handle_for(p.device.index, static_cast<cudaStream_t>(p.stream));
  const Prepared prepared = prepare(p, handle);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, p.q.data_ptr()},          {kK, p.k.data_ptr()},
      {kV, p.v.data_ptr()},          {kOut, p.out.data_ptr()},
      {kGradOut, p.grad_out.data_ptr()}, {kLse, p.lse.data_ptr()},
      {kGradQ, o.grad_q.data_ptr()}, {kGradK, o.grad_k.data_ptr()},
      {kGradV, o.grad_v.data_ptr()}};
  execute(p, prepared, handle, pack);
}

}  // namespace sdpa::cudnn
