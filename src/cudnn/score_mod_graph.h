#pragma once
// A flex score_mod on cuDNN's SDPA node. The forward graph gets the lowered program as
// its score_mod subgraph; a backward graph gets it too (cuDNN recomputes the scores) and,
// as score_mod_bprop, dS times the derivative d(score_mod)/d(score) that sdpa's autodiff
// derives (flex/autodiff.h), so no hand-written bprop is needed. Captured tensors become
// graph inputs (uids from kScoreModTensor on). The frontend side is in graph_build.h.

#include <array>
#include <memory>
#include <unordered_map>
#include <vector>

#include "cudnn/score_mod_lowering.h"

namespace sdpa::cudnn {

/// One captured read as a graph input (uid kScoreModTensor + its index): which of the
/// score_mod's captured tensors (its slot in Program::captured(); the call's own tensor is
/// bound at each execution) with the [B, H, L, S]-broadcast dims and strides of the read.
struct ScoreModInput {
  int slot = -1;
  DType dtype = DType::kFloat32;
  std::array<int64_t, 4> dims{}, strides{};
};

/// The lowered programs of one call signature.
struct ScoreModGraph {
  LoweredScoreMod forward;
  LoweredScoreMod derivative;  ///< backward graphs only: d(score_mod)/d(score)
  /// The derivative is the constant 1 (an additive bias, a mask): cuDNN then gets no
  /// score_mod_bprop, whose absence means exactly that.
  bool derivative_is_one = false;
  std::vector<ScoreModInput> inputs;
  /// Per program node, the index into `inputs` of a read node (-1 for other nodes).
  std::vector<int> forward_input, derivative_input;
  uint64_t fingerprint = 0;
};

/// A call's score_mod on cuDNN: the lowered graph (shared by every call of the same
/// signature) and the program whose captured tensors this call binds.
struct ScoreModCall {
  std::shared_ptr<const ScoreModGraph> graph;
  std::shared_ptr<const flex::Program> program;
};

/// Lowers `program` as the score_mod of the call `params` (and, for a backward, its
/// derivative). Cached per program structure, call sizes and captured layouts, so a call
/// costs a lookup. Returns null, adding the reason, when cuDNN cannot express it: an
/// operation without a pointwise form, a captured tensor that needs a gather or lives on
/// another GPU, or (backward) captured tensors that require grad (cuDNN's bprop subgraph
/// returns no gradient for them). `additive`: the program only adds terms that do not
/// depend on the score and sets elements to -inf, so its derivative is 1 wherever an
/// element is kept (and dS is 0 where it is not): the backward needs no bprop subgraph.
std::shared_ptr<const ScoreModGraph> lower_score_mod_graph(const AttentionParams& params,
                                                           const flex::Program& program,
                                                           Reasons& reasons,
                                                           bool additive = false);

/// Adds the device pointers of the call's captured tensors to `pack`. Host tensors are
/// copied on the call's stream; `keep` holds the copies until the graph is queued (their
/// memory returns to the pool in stream order, after the kernels).
void bind_score_mod_tensors(const ScoreModCall& call, const AttentionParams& params,
                            std::unordered_map<int64_t, void*>& pack, std::vector<Tensor>& keep);

}  // namespace sdpa::cudnn
