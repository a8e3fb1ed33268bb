#pragma once
// The CUDNN_ATTENTION kernels (forward.cpp, backward.cpp) and what they share.

#include <cudnn.h>

#include <memory>
#include <unordered_map>

#include "cudnn/graph_key.h"
#include "cudnn/score_mod_graph.h"
#include "dispatch/backend_impl.h"

namespace sdpa::cudnn {

struct CachedGraph;

/// A call lowered and its graph looked up (or built).
struct Prepared {
  GraphSpec spec;
  ScoreModCall score_mod;  ///< empty without a score_mod subgraph
  std::shared_ptr<CachedGraph> entry;
};

/// Forward into contiguous device tensors out [B, Hq, L, Ev] and lse [B, Hq, L].
void forward(const AttentionParams& params, const Tensor& out, const Tensor& lse);
/// Backward into contiguous device gradients.
void backward(const AttentionParams& params, sdpa::detail::BackwardOutputs& outputs);

/// Lowers `params` and finds its cached graph (built on first use); throws with cuDNN's
/// reason.
Prepared prepare(const AttentionParams& params, cudnnHandle_t handle);
/// Executes the prepared graph with `pack` (uid -> device pointer) plus the mask and
/// dropout inputs.
void execute(const AttentionParams& params, const Prepared& prepared, cudnnHandle_t handle,
             std::unordered_map<int64_t, void*>& pack);

}  // namespace sdpa::cudnn
