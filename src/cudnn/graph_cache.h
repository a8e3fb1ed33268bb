#pragma once
// Built cuDNN graphs (execution plan chosen, workspace size known), cached per GraphSpec:
// thread-safe, bounded, least recently used evicted. A spec cuDNN rejected is cached
// too, with cuDNN's reason, so selection asks cuDNN once per call signature.

#include <cudnn_frontend.h>

#include <memory>
#include <mutex>
#include <string>

#include "cudnn/graph_key.h"

namespace sdpa::cudnn {

/// Tensor uids in every graph sdpa builds.
enum Uid : int64_t {
  kQ = 1, kK, kV, kOut, kLse, kBias, kSeed, kOffset, kGradOut, kGradQ, kGradK, kGradV,
  kScoreModTensor = 64,  ///< first of the score_mod's captured-tensor inputs
};

struct CachedGraph {
  std::shared_ptr<cudnn_frontend::graph::Graph> graph;  ///< null when cuDNN refused
  int64_t workspace_bytes = 0;
  std::string error;  ///< cuDNN's reason when graph is null
  /// Executions of one graph object are serialized (the frontend keeps per-graph state).
  std::mutex execute_mutex;
};

/// The graph for `spec`, built on first use with `handle` (forward.cpp / backward.cpp);
/// `score_mod` is the lowered score_mod when spec.has_score_mod. Never null; check ->graph.
/// A thread asking for the spec it asked for last skips the shared lookup.
std::shared_ptr<CachedGraph> graph_for(const GraphSpec& spec, cudnnHandle_t handle,
                                       const std::shared_ptr<const ScoreModGraph>& score_mod);

/// Builds the graph of `spec` (forward or backward) and returns it, or throws an Error
/// carrying cuDNN's message.
std::shared_ptr<cudnn_frontend::graph::Graph> build_forward_graph(
    const GraphSpec& spec, cudnnHandle_t handle,
    const std::shared_ptr<const ScoreModGraph>& score_mod);
std::shared_ptr<cudnn_frontend::graph::Graph> build_backward_graph(
    const GraphSpec& spec, cudnnHandle_t handle,
    const std::shared_ptr<const ScoreModGraph>& score_mod);

}  // namespace sdpa::cudnn
