#pragma once
// Pieces shared by the forward and backward graph builders.

#include <cudnn_frontend.h>

#include <bit>

#include "cudnn/graph_cache.h"
#include "cudnn/graph_key.h"
#include "sdpa/error.h"

namespace sdpa::cudnn {

namespace fe = cudnn_frontend;

/// cuDNN's data type for a query dtype (float16 or bfloat16).
inline fe::DataType_t io_type(const GraphSpec& spec) {
  return static_cast<DType>(spec.dtype) == DType::kFloat16 ? fe::DataType_t::HALF
                                                           : fe::DataType_t::BFLOAT16;
}

/// A graph input or output with `spec`'s dims and strides.
inline std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph& graph,
                                                            const char* name, int64_t uid,
                                                            const TensorSpec& spec) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({spec.dims.begin(), spec.dims.end()})
                          .set_stride({spec.strides.begin(), spec.strides.end()}));
}

/// A graph with sdpa's data types (inputs and outputs in the query dtype; scores, softmax
/// and accumulation in float32) and its q, k, v inputs.
struct NewGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::shared_ptr<fe::graph::Tensor_attributes> q, k, v;
};
inline NewGraph new_graph(const GraphSpec& spec, int sm_version = 0) {
  NewGraph g{std::make_shared<fe::graph::Graph>(), nullptr, nullptr, nullptr};
  // Named ahead (tests without a GPU), the frontend does not ask the device for it.
  if (sm_version > 0) g.graph->set_sm_version(sm_version);
  g.graph->set_io_data_type(io_type(spec))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  g.q = tensor(*g.graph, "q", kQ, spec.q);
  g.k = tensor(*g.graph, "k", kK, spec.k);
  g.v = tensor(*g.graph, "v", kV, spec.v);
  return g;
}

/// A scalar int64 passed by value (dropout seed and offset).
inline std::shared_ptr<fe::graph::Tensor_attributes> scalar(fe::graph::Graph& graph,
                                                            const char* name, int64_t uid) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT64)
                          .set_is_pass_by_value(true));
}

/// Applies the band, bias and dropout of `spec` to forward or backward SDPA attributes
/// (both have the same setters). Returns the bias tensor (null without one).
template <typename Attributes>
std::shared_ptr<fe::graph::Tensor_attributes> apply_mask(fe::graph::Graph& graph,
                                                         const GraphSpec& spec,
                                                         Attributes& attributes) {
  attributes.set_attn_scale(std::bit_cast<float>(static_cast<uint32_t>(spec.scale_bits)));
  if (spec.has_band) {
    attributes.set_diagonal_alignment(spec.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                        : fe::DiagonalAlignment_t::TOP_LEFT);
    // cuDNN keeps key j when j > i - left_bound: sdpa's left (keys before the diagonal)
    // is one less.
    if (spec.has_left) attributes.set_diagonal_band_left_bound(static_cast<int>(spec.left + 1));
    if (spec.has_right) attributes.set_diagonal_band_right_bound(static_cast<int>(spec.right));
  }
  std::shared_ptr<fe::graph::Tensor_attributes> bias;
  if (spec.has_bias) {
    bias = tensor(graph, "bias", kBias, spec.bias);
    attributes.set_bias(bias);
  }
  if (spec.dropout_bits != 0) {
    attributes.set_dropout(std::bit_cast<float>(static_cast<uint32_t>(spec.dropout_bits)),
                           scalar(graph, "seed", kSeed), scalar(graph, "offset", kOffset));
  }
  return bias;
}

/// The forward / backward graph of `spec`, nodes only (not validated or planned):
/// build_forward_graph / build_backward_graph finish it for a handle. `sm_version`
/// (e.g. 90) names the target instead of the current device's.
std::shared_ptr<fe::graph::Graph> forward_graph(
    const GraphSpec& spec, const std::shared_ptr<const ScoreModGraph>& score_mod,
    int sm_version = 0);
std::shared_ptr<fe::graph::Graph> backward_graph(
    const GraphSpec& spec, const std::shared_ptr<const ScoreModGraph>& score_mod,
    int sm_version = 0);

/// Installs `g` on forward / backward SDPA attributes of `graph` (score_mod_graph.cpp):
/// creates the captured tensors' inputs and the score_mod (and score_mod_bprop) subgraph
/// builders.
void set_score_mod(fe::graph::Graph& graph, fe::graph::SDPA_attributes& attributes,
                   std::shared_ptr<const ScoreModGraph> g);
void set_score_mod(fe::graph::Graph& graph, fe::graph::SDPA_backward_attributes& attributes,
                   std::shared_ptr<const ScoreModGraph> g);

/// Validates, lowers and plans `graph` (heuristics A, then the fallback list), throwing
/// sdpa::Error with cuDNN's message when any step fails.
inline void finish(fe::graph::Graph& graph, cudnnHandle_t handle, const GraphSpec& spec) {
  const auto fail = [&](fe::error_t status, const char* step) {
    sdpa::detail::throw_error("cuDNN ", step, " (", describe(spec), "): ", status.get_message());
  };
  if (auto s = graph.validate(); s.is_bad()) fail(s, "validate");
  if (auto s = graph.build_operation_graph(handle); s.is_bad()) fail(s, "build_operation_graph");
  if (auto s = graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
      s.is_bad()) {
    fail(s, "create_execution_plans");
  }
  if (auto s = graph.check_support(handle); s.is_bad()) fail(s, "check_support");
  if (auto s = graph.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); s.is_bad()) {
    fail(s, "build_plans");
  }
}

}  // namespace sdpa::cudnn
