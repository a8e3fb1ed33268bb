#pragma once
// Per-target bodies of the CPU flash backward (flash_backward_tile.cc) and the scratch
// memory one thread reuses across blocks.

#include <cstdint>
#include <optional>

#include "cpu/capability.h"
#include "cpu/flash_tile.h"
#include "cpu/kernel_context.h"
#include "cpu/score_mod_grad.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// One thread's float32 working set (E_pad, Ev_pad: head dims rounded up to kMaxLanes):
///   probs / dscores [kBlockQ, kBlockKv], dk / dv [kBlockKv, E_pad / Ev_pad],
///   dq [kBlockQ, E_pad], keep [kBlockKv], row [max(E, Ev)], mod_input [kBlockQ, kBlockKv];
/// in bf16 mode (PackedBackwardGroup::bf16) P and dS as bf16 pairs over the q rows,
///   p_pairs / ds_pairs [kBlockQ / 2][kBlockKv][2], and dS rows ds_bf16 [kBlockQ, kBlockKv].
struct FlashBackwardScratch {
  FlashBackwardScratch(const AttentionParams& params, const FlexBackward* flex_grad, bool bf16);
  FlashBackwardScratch(const FlashBackwardScratch&) = delete;
  FlashBackwardScratch& operator=(const FlashBackwardScratch&) = delete;

  int64_t head_dim_qk_padded;
  int64_t head_dim_vo_padded;
  float *probs, *dscores;
  float *dk, *dv, *dq, *keep, *row;
  uint16_t *p_pairs, *ds_pairs, *ds_bf16;
  float* mod_input;  // [kBlockQ, kBlockKv]: scores as score_mod saw them
  flex::RowState flex;
  std::optional<flex::RowBuffers> grad_rows;  // evaluates FlexBackward::program
  /// bf16 mode on an AMX CPU: this thread's tiles, configured while the scratch lives.
  AmxTiles amx;

 private:
  Tensor buffer_;
};

class PackedBackwardGroup;

/// Keys [kv_begin, kv_begin + kBlockKv) of kv head `hk` of batch `b` (kv_begin unused by
/// FlashHeadBackward, which covers all keys).
struct KvTile {
  int64_t b;
  int64_t hk;
  int64_t kv_begin;
};

/// Pass 1: grad_k / grad_v rows of key tile `kv`, summed over the query heads of its
/// group (packed in `group`). A non-null `dq_acc` [group_size, L, E_pad] also receives this
/// key tile's share of the group's unscaled dQ (FlashHeadBackward).
using FlashKvBlockBackwardFn = void (*)(const BackwardCall& call, const PackedBackwardGroup& group,
                                        const KvTile& kv, FlashBackwardScratch& scratch,
                                        float* dq_acc);

/// Pass 2: grad_q rows `q`; captured-tensor gradients go to `chunk` of
/// call.flex_grad->captured.
using FlashQBlockBackwardFn = void (*)(const BackwardCall& call, const PackedBackwardGroup& group,
                                       const QueryTile& q, int64_t chunk,
                                       FlashBackwardScratch& scratch);

/// One pass over (b, hk) of `head`: every key tile's grad_k / grad_v and, summed in
/// `dq_acc` [group_size, L, E_pad] (scratch), grad_q of the group's query heads: five GEMMs
/// per (q block, key tile) instead of the two passes' seven (pass 2 recomputes S and dP).
/// Each dQ block sums the key tiles in the order pass 2 does, so both give the same bits.
/// Not for flex calls with captured-tensor gradients (their chunks follow pass 2's order).
using FlashHeadBackwardFn = void (*)(const BackwardCall& call, const PackedBackwardGroup& group,
                                     const KvTile& head, FlashBackwardScratch& scratch,
                                     float* dq_acc);

struct FlashBackwardKernels {
  FlashKvBlockBackwardFn kv_block;
  FlashQBlockBackwardFn q_block;
  FlashHeadBackwardFn head;
};

/// The backward bodies compiled for `capability`.
FlashBackwardKernels flash_backward_kernels_for(Capability capability);

}  // namespace sdpa::cpu
