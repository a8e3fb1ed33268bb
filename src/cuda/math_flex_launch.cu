// Host side of MATH launches with flex programs on CUDA (math_flex_launch.h).

#include <cstring>
#include <tuple>
#include <vector>

#include "cuda/math_flex_launch.h"
#include "flex/autodiff.h"
#include "sdpa/cuda.h"
#include "sdpa/error.h"

namespace sdpa::cuda::math {
namespace {

// The BlockMask's lists as a state per (q block, kv block): 0 empty, 1 partial, 2 full.
Tensor block_states(const flex::BlockMask& m) {
  const int64_t nq = m.num_q_blocks(), nkv = m.num_kv_blocks();
  const int64_t rows = m.batch * m.num_heads * nq;
  Tensor states = Tensor::zeros({rows * nkv}, DType::kBool);
  auto* out = static_cast<uint8_t*>(states.data_ptr());
  for (const auto& [num, indices, state] :
       {std::tuple{&m.kv_num_blocks, &m.kv_indices, 1},
        std::tuple{&m.full_kv_num_blocks, &m.full_kv_indices, 2}}) {
    const Tensor counts = num->contiguous(), lists = indices->contiguous();
    for (int64_t row = 0; row < rows; ++row) {
      for (int32_t e = 0; e < counts.data<int32_t>()[row]; ++e) {
        out[row * nkv + lists.data<int32_t>()[row * nkv + e]] = static_cast<uint8_t>(state);
      }
    }
  }
  return states;
}

}  // namespace

FlexParts::FlexParts(const AttentionParams& p, bool backward) {
  const flex::Program* score_mod = p.mask.score_mod.get();
  const flex::BlockMask* blocks = p.mask.block_mask.get();
  const auto may_fail = [&](const flex::CompiledProgram& code,
                            const std::vector<flex::Captured>& captured) {
    return program_may_fail(code, captured, p.batch, p.num_heads_q, p.q_len, p.kv_len);
  };
  if (score_mod != nullptr) {
    score_program_ = DeviceProgram(*score_mod, p.device, p.stream);
    may_fail_ = may_fail(*score_mod->compiled(), score_mod->captured());
    if (backward) {
      // In the score_mod's slots, so a failure of either names the right tensor.
      const flex::GradientProgram d = flex::differentiate(*score_mod);
      const flex::CompiledProgram code = d.in_slots_of(score_mod->captured());
      grad_program_ = DeviceProgram(code, d.d_score, score_mod->captured(), p.device, p.stream);
      may_fail_ = may_fail_ || may_fail(code, score_mod->captured());
    }
  }
  if (blocks != nullptr && blocks->mask_mod) {
    mask_program_ = DeviceProgram(*blocks->mask_mod, p.device, p.stream);
    may_fail_ = may_fail_ || may_fail(*blocks->mask_mod->compiled(), blocks->mask_mod->captured());
  }
  mask.score_mod = score_program_.view();
  mask.score_mod_grad = grad_program_.view();
  mask.mask_mod = mask_program_.view();
  if (blocks != nullptr) {
    states_ = to_device(block_states(*blocks), p.device, p.stream);
    mask.block_states = static_cast<const uint8_t*>(states_.data_ptr());
    mask.block_batches = blocks->batch;
    mask.block_heads = blocks->num_heads;
    mask.num_q_blocks = blocks->num_q_blocks();
    mask.num_kv_blocks = blocks->num_kv_blocks();
    mask.q_block_size = blocks->q_block_size;
    mask.kv_block_size = blocks->kv_block_size;
  }
  status_ = to_device(
      Tensor::zeros({2 * static_cast<int64_t>(sizeof(flex_interp::Status))}, DType::kBool),
      p.device, p.stream);
  mask.score_mod_status = static_cast<flex_interp::Status*>(status_.data_ptr());
  mask.mask_mod_status = mask.score_mod_status + 1;
}

void FlexParts::check(const AttentionParams& p) const {
  if (!may_fail_) return;
  flex_interp::Status records[2]{};
  const Tensor host = to_device(status_, Device{}, p.stream);
  std::memcpy(records, host.data_ptr(), sizeof(records));
  static const std::vector<flex::Captured> kNone;
  const flex::BlockMask* blocks = p.mask.block_mask.get();
  // The derivative reads in the score_mod's slots and records in its record.
  SDPA_CHECK(records[0].code == 0,
             flex_failure_message("score_mod", records[0],
                                  p.mask.score_mod ? p.mask.score_mod->captured() : kNone));
  SDPA_CHECK(
      records[1].code == 0,
      flex_failure_message("mask_mod", records[1],
                           blocks && blocks->mask_mod ? blocks->mask_mod->captured() : kNone));
}

}  // namespace sdpa::cuda::math
