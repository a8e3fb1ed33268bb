// CUDNN_ATTENTION forward: cuDNN frontend's SDPA node (FlashAttention-2-style fused
// kernels, Dao 2023, as cuDNN implements them), with lse from its softmax statistics.

#include "cudnn/forward.h"

#include <bit>
#include <unordered_map>

#include "cudnn/graph_build.h"
#include "cudnn/graph_cache.h"
#include "cudnn/handle.h"
#include "cudnn/score_mod_graph.h"
#include "cuda/copy.h"
#include "cuda/status.h"
#include "sdpa/cuda.h"

namespace sdpa::cudnn {

std::shared_ptr<fe::graph::Graph> forward_graph(
    const GraphSpec& spec, const std::shared_ptr<const ScoreModGraph>& score_mod,
    int sm_version) {
  auto [graph, q, k, v] = new_graph(spec, sm_version);
  auto attributes = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true);
  apply_mask(*graph, spec, attributes);
  if (score_mod != nullptr) set_score_mod(*graph, attributes, score_mod);
  auto [out, stats] = graph->sdpa(q, k, v, attributes);
  const int64_t b = spec.q.dims[0], h = spec.q.dims[1], l = spec.q.dims[2];
  const int64_t ev = spec.v.dims[3];
  out->set_output(true).set_uid(kOut).set_dim({b, h, l, ev}).set_stride({h * l * ev, l * ev, ev, 1});
  stats->set_output(true)
      .set_uid(kLse)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({b, h, l, 1})
      .set_stride({h * l, l, 1, 1});
  return graph;
}

std::shared_ptr<fe::graph::Graph> build_forward_graph(
    const GraphSpec& spec, cudnnHandle_t handle,
    const std::shared_ptr<const ScoreModGraph>& score_mod) {
  auto graph = forward_graph(spec, score_mod);
  finish(*graph, handle, spec);
  return graph;
}

/// Runs `entry`'s graph with the call's pointers; the workspace comes from the stream's
/// pool and returns to it after the kernels (stream-ordered).
void execute(const AttentionParams& p, const Prepared& prepared, cudnnHandle_t handle,
             std::unordered_map<int64_t, void*>& pack) {
  const GraphSpec& spec = prepared.spec;
  CachedGraph& entry = *prepared.entry;
  int64_t seed = static_cast<int64_t>(p.dropout.philox.seed);
  int64_t offset = static_cast<int64_t>(p.dropout.philox.offset);
  if (p.has_dropout()) {
    pack[kSeed] = &seed;
    pack[kOffset] = &offset;
  }
  Tensor bias;
  if (spec.has_bias) {
    bias = bias_view(p);
    if (spec.bias_repacked) bias = cuda::detail::copy_with_aligned_rows(bias, 16, p.stream);
    pack[kBias] = bias.data_ptr();
  }
  std::vector<Tensor> captured;  // host tensors of a score_mod, copied for this call
  if (prepared.score_mod.graph != nullptr) bind_score_mod_tensors(prepared.score_mod, p, pack, captured);
  Tensor workspace;
  if (entry.workspace_bytes > 0) {
    workspace = cuda::empty({entry.workspace_bytes}, DType::kBool, p.device.index, p.stream);
  }
  std::lock_guard lock(entry.execute_mutex);
  const auto status = entry.graph->execute(handle, pack, workspace.defined() ? workspace.data_ptr() : nullptr);
  if (status.is_bad()) {
    sdpa::detail::throw_error("cuDNN execute: ", const_cast<fe::error_t&>(status).get_message());
  }
}

Prepared prepare(const AttentionParams& p, cudnnHandle_t handle) {
  Prepared prepared;
  Reasons quiet{false, {}};
  SDPA_CHECK(lower(p, prepared.spec, quiet, &prepared.score_mod),
             "CUDNN_ATTENTION: the call cannot be lowered to cuDNN");
  prepared.entry = graph_for(prepared.spec, handle, prepared.score_mod.graph);
  SDPA_CHECK(prepared.entry->graph != nullptr, prepared.entry->error);
  return prepared;
}

void forward(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  cuda::detail::DeviceGuard guard(p.device.index);
  cudnnHandle_t handle = handle_for(p.device.index, static_cast<cudaStream_t>(p.stream));
  const Prepared prepared = prepare(p, handle);
  std::unordered_map<int64_t, void*> pack = {{kQ, p.q.data_ptr()},   {kK, p.k.data_ptr()},
                                             {kV, p.v.data_ptr()},   {kOut, out.data_ptr()},
                                             {kLse, lse.data_ptr()}};
  execute(p, prepared, handle, pack);
}

}  // namespace sdpa::cudnn
