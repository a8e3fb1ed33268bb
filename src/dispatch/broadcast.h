#pragma once
// Inputs of other ranks and broadcast key/value batch dimensions, as PyTorch's SDPA takes
// them: q [*, L, E] with 0 to 6 leading dimensions; k/v [*, S, E/Ev] whose leading
// dimensions broadcast against q's (missing or size-1 dimensions expand; under enable_gqa
// the head dimension, the last leading one, may instead divide q's). Such a call runs as
// a 4-D [B, H, N, D] call on views (leading dimensions merged into B) and its results are
// shaped back: outputs like q, gradients like each input (summed over broadcast
// dimensions).

#include "sdpa/sdpa.h"

namespace sdpa::detail {

/// A call reduced to 4-D views, with what shaping the results back needs.
struct BroadcastCall {
  Tensor q, k, v;      ///< [B, Hq, L, E], [B, Hkv, S, E], [B, Hkv, S, Ev]
  SDPAOptions options;  ///< a tensor attn_mask of q's rank merged like q
  Shape q_shape, k_shape, v_shape;  ///< the caller's
  Shape k_expanded, v_expanded;     ///< k/v broadcast to q's leading dims, before merging

  /// The caller's out [*, L, Ev] and lse [*, L] shapes.
  Shape out_shape() const {
    Shape s = q_shape;
    s.back() = v_shape.back();
    return s;
  }
  Shape lse_shape() const { return Shape(q_shape.begin(), q_shape.end() - 1); }
};

/// Whether the call needs reducing: q not 3-D/4-D, k/v of another rank than q, or k/v
/// leading dimensions of size 1 against larger ones of q (outside GQA's head dimension).
bool needs_broadcast(const Tensor& q, const Tensor& k, const Tensor& v, const SDPAOptions& opt);

/// Reduces the call; throws sdpa::Error naming the argument whose shape does not
/// broadcast.
BroadcastCall broadcast_call(const Tensor& q, const Tensor& k, const Tensor& v,
                             const SDPAOptions& opt);

/// `t` ([*lead, r, c]) as 4-D [prod(lead[:-1]), lead[-1], r, c] (1s prepended for fewer
/// than two leading dimensions): a view when the merged dimensions form one arithmetic
/// progression in memory (broadcast ones do), else one contiguous copy.
Tensor merge_batch_dims(const Tensor& t, void* stream);

/// Sums host tensor `full` over the dimensions `shape` broadcasts along (leading ones
/// included): autograd's rule for a broadcast input. Returns a contiguous `dtype` tensor.
Tensor sum_to_shape(const Tensor& full, const Shape& shape, DType dtype);

/// `grad` (contiguous, shaped like `expanded`) reduced to `shape` on its own device.
Tensor reduce_gradient(const Tensor& grad, const Shape& expanded, const Shape& shape,
                       void* stream);

}  // namespace sdpa::detail
