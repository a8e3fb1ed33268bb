#pragma once
// A flex BlockMask on cuDNN: cuDNN's SDPA node has no block lists and its score_mod
// subgraph no gather, so a BlockMask reaches it only as what its mask_mod is. A band of
// q_idx - kv_idx (causal, sliding windows: flex/mask_band.h) whose block lists follow it
// becomes cuDNN's native band, whose kernels skip the tiles outside it as the BlockMask
// would; beside a score_mod (under which cuDNN turns its own masks off) the band joins
// the score_mod subgraph as where(band, score_mod(score), -inf).

#include <memory>
#include <optional>

#include "dispatch/backend_impl.h"
#include "sdpa/flex.h"

namespace sdpa::cudnn {

/// The band the call's BlockMask runs (top-left, sequence frame; possibly without
/// bounds), or nothing, adding the reason: no mask_mod, a mask_mod that is not a band,
/// block lists that do not follow it, or query rows the band leaves without keys (zeros
/// by sdpa's rule, which cuDNN is not asked to give). The thread's last verdict is reused
/// for the same BlockMask object (selection and the kernel of one call).
std::optional<DiagonalBand> block_mask_band(const AttentionParams& params, Reasons& reasons);

/// where(band, score_mod, -inf) as one score_mod program (the band's bounds as index
/// comparisons). The thread's last answer is reused for the same score_mod and band.
std::shared_ptr<const flex::Program> banded_score_mod(
    const std::shared_ptr<const flex::Program>& score_mod, const DiagonalBand& band);

}  // namespace sdpa::cudnn
