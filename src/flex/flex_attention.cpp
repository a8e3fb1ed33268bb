// flex_attention entry points: the call is ordinary attention params plus a score_mod
// program and a BlockMask in the mask descriptor, so backend selection, dropout and
// AttnBias composition are shared with scaled_dot_product_attention.

#include "sdpa/flex_attention.h"

#include "cpu/kernels.h"
#include "dispatch/lowering.h"
#include "flex/node.h"
#include "sdpa/error.h"

namespace sdpa {
namespace {

void add_flex(AttentionParams& p, const std::optional<flex::Program>& score_mod,
              const flex::BlockMask* block_mask) {
  if (score_mod) {
    SDPA_CHECK(!score_mod->is_mask(), "score_mod: expected a score_mod program, got a mask_mod");
    flex::require_captured_on(*score_mod, p.device, "the call");
    p.mask.score_mod = std::make_shared<const flex::Program>(*score_mod);
  }
  if (block_mask) {
    const flex::BlockMask& m = *block_mask;
    SDPA_CHECK(m.q_len == p.q_len && m.kv_len == p.kv_len, "block_mask: expected Q_LEN=",
               p.q_len, " and KV_LEN=", p.kv_len, " (the call's L and S), got ", m.q_len, " and ",
               m.kv_len);
    SDPA_CHECK(m.batch == 1 || m.batch == p.batch, "block_mask: expected batch 1 or ", p.batch,
               ", got ", m.batch);
    SDPA_CHECK(m.num_heads == 1 || m.num_heads == p.num_heads_q, "block_mask: expected heads 1 "
               "or ", p.num_heads_q, ", got ", m.num_heads);
    // Its mask_mod runs where the call does (lists made elsewhere, e.g. torch's on a GPU,
    // may capture tensors of that device).
    if (m.mask_mod) flex::require_captured_on(*m.mask_mod, p.device, "the call");
    p.mask.block_mask = std::make_shared<const flex::BlockMask>(m);
  }
}

}  // namespace

AttentionResult flex_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const std::optional<flex::Program>& score_mod,
                               const flex::BlockMask* block_mask, const SDPAOptions& options) {
  AttentionParams p = make_params(q, k, v, options);
  add_flex(p, score_mod, block_mask);
  return run_forward(p);
}

AttentionResult flex_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const flex::ScoreMod& score_mod, const flex::BlockMask* block_mask,
                               const SDPAOptions& options) {
  return flex_attention(q, k, v, flex::Program::from_score_mod(score_mod), block_mask, options);
}

Tensor flex_attention_max_scores(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const std::optional<flex::Program>& score_mod,
                                 const flex::BlockMask* block_mask, const SDPAOptions& options) {
  AttentionParams p = make_params(q, k, v, options);
  add_flex(p, score_mod, block_mask);
  SDPA_CHECK(p.device.type == DeviceType::kCPU, "flex_attention max_scores: expected CPU "
             "tensors, got tensors on ", device_name(p.device));
  Tensor max_scores = Tensor::empty({p.batch, p.num_heads_q, p.q_len}, DType::kFloat32);
  cpu::math_max_scores(with_materialized_bias(p), max_scores);
  return p.unbatched ? max_scores.squeeze(0) : max_scores;
}

AttentionGradients flex_attention_backward(const Tensor& grad_out, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& lse,
                                           const std::optional<flex::Program>& score_mod,
                                           const flex::BlockMask* block_mask,
                                           const SDPAOptions& options) {
  AttentionParams p = make_backward_params(grad_out, q, k, v, out, lse, options);
  add_flex(p, score_mod, block_mask);
  return run_backward(p, options.attn_mask.tensor());
}

}  // namespace sdpa
