#pragma once
// Per-target bodies of the CPU flash backward (flash_backward_tile.cc) and the scratch
// memory one thread reuses across blocks.

#include <cstdint>
#include <optional>

#include "cpu/capability.h"
#include "cpu/flash_tile.h"
#include "flex/autodiff.h"
#include "flex/captured_grads.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// One thread's float32 working set (E_pad, Ev_pad: head dims rounded up to kMaxLanes):
///   probs / dscores [kBlockQ, kBlockKv], probs_t / dscores_t [kBlockKv, kBlockQ],
///   dk / dv [kBlockKv, E_pad / Ev_pad], dq [kBlockQ, E_pad], keep [kBlockKv],
///   row [max(E, Ev)], mod_input [kBlockQ, kBlockKv].
/// The derivative of a flex score_mod and the accumulator of its captured tensors'
/// gradients, shared by all threads of one backward call.
struct FlexBackward {
  flex::GradientProgram program;
  std::optional<flex::CapturedGrads> captured;
};

struct FlashBackwardScratch {
  FlashBackwardScratch(const AttentionParams& params, const FlexBackward* flex_grad);
  FlashBackwardScratch(const FlashBackwardScratch&) = delete;
  FlashBackwardScratch& operator=(const FlashBackwardScratch&) = delete;

  int64_t head_dim_qk_padded;
  int64_t head_dim_vo_padded;
  float *probs, *dscores, *probs_t, *dscores_t;
  float *dk, *dv, *dq, *keep, *row;
  float* mod_input;  // [kBlockQ, kBlockKv]: scores as score_mod saw them
  flex::RowState flex;
  std::optional<flex::RowBuffers> grad_rows;  // evaluates FlexBackward::program

 private:
  Tensor buffer_;
};

class PackedBackwardGroup;

/// Pass 1: grad_k / grad_v rows [kv_begin, kv_begin + kBlockKv) of kv head `hk`, summed
/// over the query heads of its group (packed in `group`). `delta` is rowsum(dO o O),
/// float32 [B, Hq, L].
using FlashKvBlockBackwardFn = void (*)(const AttentionParams& params,
                                        const PackedBackwardGroup& group, const float* delta,
                                        FlexBackward* flex_grad, int64_t b, int64_t hk,
                                        int64_t kv_begin, FlashBackwardScratch& scratch,
                                        const Tensor& grad_k, const Tensor& grad_v);
/// Pass 2: grad_q rows [q_begin, q_begin + kBlockQ) of head `h`; captured-tensor
/// gradients go to `chunk` of flex_grad->captured.
using FlashQBlockBackwardFn = void (*)(const AttentionParams& params,
                                       const PackedBackwardGroup& group, const float* delta,
                                       FlexBackward* flex_grad, int64_t chunk, int64_t b,
                                       int64_t h, int64_t q_begin,
                                       FlashBackwardScratch& scratch, const Tensor& grad_q);

struct FlashBackwardKernels {
  FlashKvBlockBackwardFn kv_block;
  FlashQBlockBackwardFn q_block;
};

/// The backward bodies compiled for `capability`.
FlashBackwardKernels flash_backward_kernels_for(Capability capability);

}  // namespace sdpa::cpu
