#pragma once
// What the CPU kernels of one call share: the index of a score or lse row in the call's
// [B, Hq, L, S] / [B, Hq, L] spaces (the dropout mask and the lse are addressed by these,
// so forward, decode, backward and MATH agree), the tile coordinate, and the per-call
// contexts of the flash forward and backward.

#include <cstdint>

#include "cpu/philox.h"
#include "dispatch/kernel_io.h"
#include "sdpa/params.h"
#include "sdpa/tensor.h"

namespace sdpa::cpu {

/// Query row i of (batch b, query head h) as a linear index into [B, Hq, L] (a contiguous
/// lse; times S, the first score of the row in [B, Hq, L, S]).
inline int64_t query_row_index(const AttentionParams& p, int64_t b, int64_t h, int64_t i) {
  return (b * p.num_heads_q + h) * p.q_len + i;
}

/// The lse of query row i of (b, h) read through lse's strides (a caller's view may be
/// non-contiguous).
inline float lse_at(const Tensor& lse, int64_t b, int64_t h, int64_t i) {
  return lse.data<float>()[b * lse.stride(0) + h * lse.stride(1) + i * lse.stride(2)];
}

/// Score (b, h, i, j): query row i of (batch b, query head h) against key j.
struct ScoreIndex {
  int64_t b, h, i, j;
};

/// Applies the call's dropout to P's scores `first` .. `first` + n - 1 along the keys,
/// held at row[0, n): each element is zeroed or scaled by 1 / (1 - dropout_p), as drawn by
/// its index in [B, Hq, L, S] (philox.h), so that every kernel draws the same mask; with a
/// DropoutPosition, its index in the larger call's scores.
template <typename T>
inline void apply_dropout(const AttentionParams& p, const ScoreIndex& first, T* row, int64_t n) {
  const DropoutParams& d = p.dropout;
  const int64_t rows = d.q_total != 0 ? d.q_total : p.q_len;
  const int64_t cols = d.kv_total != 0 ? d.kv_total : p.kv_len;
  const int64_t element =
      ((first.b * p.num_heads_q + first.h) * rows + d.q_offset + first.i) * cols + d.kv_offset +
      first.j;
  DropoutStream(d.philox, d.p).apply(static_cast<uint64_t>(element), row, n);
}

/// A tile coordinate: query rows [q_begin, q_begin + rows) of (batch b, query head h).
struct QueryTile {
  int64_t b;
  int64_t h;
  int64_t q_begin;
  int64_t rows;
};

class PackedKv;

/// What every q-block of one flash forward call shares, read-only across its threads:
/// the call, its packed K/V (pack.h), the outputs (out [B, Hq, L, Ev], lse [B, Hq, L]
/// contiguous float32) and the softmax scale as float32.
struct ForwardCall {
  const AttentionParams& p;
  const PackedKv& kv;
  const Tensor& out;
  float* lse;
  float scale;
};

struct FlexBackward;

/// What every block of one flash backward call shares: the call, delta = rowsum(dO o O)
/// (float32 [B, Hq, L]), the flex score_mod's derivative (null without one; its captured
/// gradients are summed per chunk), the gradients written, and the scale as float32.
struct BackwardCall {
  const AttentionParams& p;
  const float* delta;
  FlexBackward* flex_grad;
  const detail::BackwardOutputs& grads;
  float scale;
};

/// A (query block, key tile) pair of the backward: query rows `q` of head q.h, the g-th of
/// its kv head's group, against keys [kv_begin, kv_begin + cols). Flex captured-tensor
/// gradients go to chunk `chunk` (-1: not gathered).
struct BlockPair {
  QueryTile q;
  int64_t g;
  int64_t kv_begin;
  int64_t cols;
  int64_t chunk;
};

}  // namespace sdpa::cpu
