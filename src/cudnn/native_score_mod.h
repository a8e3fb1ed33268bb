#pragma once
// Native mask parts cuDNN's SDPA node has no setting for here, written as a flex score_mod
// so they reach cuDNN through its score_mod subgraph: ALiBi with arbitrary slopes (cuDNN's
// own ALiBi fixes them), key padding and packed documents, with the call's sequence-frame
// bands beside them (cuDNN turns its band masking off under a score_mod). Every element
// is computed (no tile is skipped), which still beats MATH on CUDA by far.

#include <memory>

#include "dispatch/backend_impl.h"
#include "sdpa/flex.h"

namespace sdpa::cudnn {

/// Whether the call has a mask part that needs native_score_mod (ALiBi, key padding or
/// packed documents) and no flex program of its own.
bool needs_native_score_mod(const MaskDescriptor& mask);

/// The score_mod of the call's native mask (MaskDescriptor's definitions):
///   score - slopes[h] * |q_idx + d - kv_idx|      (ALiBi, slopes a float32 [Hq] capture)
/// then -inf outside the keys each row keeps: sequence-frame bands as index arithmetic;
/// with documents, key padding or bands in other frames, the interval of keys of each
/// (batch, row) as the CPU kernels compute it (cpu/mask_rows.h), captured as int32
/// [B or 1, L] first and end keys. Captured values are bound per call, so calls differing
/// only in them share a cuDNN graph. Returns null, adding the reason, when some query row
/// would keep no key (sdpa gives such rows zeros; cuDNN is not asked to).
std::shared_ptr<const flex::Program> native_score_mod(const AttentionParams& params,
                                                      Reasons& reasons);

}  // namespace sdpa::cudnn
