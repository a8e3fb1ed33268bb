#pragma once
// Flex programs in the MATH kernels on CUDA: a BlockMask as per-block states and the
// score_mod / mask_mod interpreted per element (cuda/flex_interpreter.cuh), in the order
// the CPU's MATH applies them (cpu/mask_rows.h): additive terms, score_mod, then the masks.

#include "cuda/flex_interpreter.cuh"
#include "cuda/math_device.cuh"

namespace sdpa::cuda::math {

/// A call's flex parts on the device. Programs with count 0 are absent.
struct FlexMask {
  flex_interp::Program score_mod;
  /// d(score_mod)/d(score) (flex/autodiff.h), in backward calls.
  flex_interp::Program score_mod_grad;
  flex_interp::Program mask_mod;
  /// The BlockMask as states [Bm, Hm, q blocks, kv blocks] (0 empty, 1 partial, 2 full;
  /// Bm, Hm 1 when broadcast); null without one.
  const uint8_t* block_states;
  int64_t block_batches, block_heads, num_q_blocks, num_kv_blocks, q_block_size, kv_block_size;
  /// Failure records of the score_mod and of the mask_mod.
  flex_interp::Status* score_mod_status;
  flex_interp::Status* mask_mod_status;
};

/// Score `s` (q.k * scale) of (b, h, i, j) with every mask part and the flex programs, as
/// cpu/mask_rows.h's mask_score_cols: additive dense term, score_mod, then -inf outside a
/// band, where a bool mask drops the key, in an empty block, or where the mask_mod of a
/// partial block is false. `values` holds flex_interp::kMaxInstructions doubles; `pre_mod`
/// (when not null) receives the score the score_mod saw.
template <typename T, typename Acc>
__device__ inline Acc apply_flex_mask(Acc s, const DenseMask& m, const Bands& bands,
                                      const FlexMask& f, int64_t b, int64_t h, int64_t i, int64_t j,
                                      double* values, Acc* pre_mod = nullptr) {
  if (!in_bands(bands, i, j)) return Acc(-INFINITY);
  const int64_t at = b * m.s0 + h * m.s1 + i * m.s2 + j * m.s3;
  if (m.kind == 3) s += Acc(static_cast<const float*>(m.data)[at]);
  if (m.kind == 2) s += to_acc(static_cast<const T*>(m.data)[at]);
  if (pre_mod != nullptr) *pre_mod = s;
  if (f.score_mod.count > 0) {
    s = Acc(flex_interp::evaluate(f.score_mod, static_cast<double>(s),
                                  flex_interp::Site{b, h, i, j, f.score_mod_status}, values));
  }
  if (m.kind == 1 && !static_cast<const bool*>(m.data)[at]) return Acc(-INFINITY);
  if (f.block_states != nullptr) {
    const int64_t row =
        ((f.block_batches > 1 ? b : 0) * f.block_heads + (f.block_heads > 1 ? h : 0)) *
            f.num_q_blocks +
        i / f.q_block_size;
    const uint8_t state = f.block_states[row * f.num_kv_blocks + j / f.kv_block_size];
    if (state == 0) return Acc(-INFINITY);
    if (state == 1 && f.mask_mod.count > 0 &&
        flex_interp::evaluate(f.mask_mod, 0.0, flex_interp::Site{b, h, i, j, f.mask_mod_status},
                              values) == 0.0) {
      return Acc(-INFINITY);
    }
  }
  return s;
}

/// The chain rule through the score_mod: d(score_mod)/d(score) at the score it saw
/// (`pre_mod`, from apply_flex_mask), 1 without a score_mod.
template <typename Acc>
__device__ inline Acc score_mod_slope(const FlexMask& f, Acc pre_mod, int64_t b, int64_t h,
                                      int64_t i, int64_t j, double* values) {
  if (f.score_mod_grad.count == 0) return Acc(1);
  return Acc(flex_interp::evaluate(f.score_mod_grad, static_cast<double>(pre_mod),
                                   flex_interp::Site{b, h, i, j, f.score_mod_status}, values));
}

}  // namespace sdpa::cuda::math
