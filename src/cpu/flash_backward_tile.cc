// Per-target bodies of the CPU flash backward (FlashAttention-2, Dao 2023, Algorithm 2):
// P is recomputed from the forward's logsumexp, dS = P o (dP - D) with D = rowsum(dO o O).
// bfloat16 inputs on vdpbf16ps CPUs multiply as bf16 with float32 sums; P and dS are
// rounded to bf16 for their products, as FlashAttention's GPU kernels do.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_backward_tile.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>

#include "cpu/bf16_dot.h"
#include "cpu/flash_backward_tile.h"
#include "cpu/gemm-inl.h"
#include "cpu/kernel_context.h"
#include "cpu/pack_backward.h"
#include "cpu/target_kernels-inl.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace {

// vdpbf16ps kernels exist only at the AVX512 level, the only one uses_bf16_dot() allows
// (TargetKernels::kBf16Dot); elsewhere the bf16 branches are discarded.
constexpr bool kBf16Target = TargetKernels::kBf16Dot;

// dscore (w.r.t. the score_mod's output) becomes the gradient w.r.t. its input; with
// chunk >= 0 the captured tensors' gradients dscore * d(score_mod)/d(read) are scattered
// to that chunk. Lanes with dscore == 0 (masked, dropped) contribute nothing.
// Row i of pair `t`: mod_input the scores as score_mod saw them, dscore the row's dS.
struct ScoreRowGrad {
  int64_t i;
  const float* mod_input;
  float* dscore;
};
void ChainThroughScoreMod(FlexBackward& fg, const BlockPair& t, const ScoreRowGrad& row,
                          FlashBackwardScratch& ws) {
  flex::RowBuffers& rows = *ws.grad_rows;
  const int64_t chunk = t.chunk, cols = t.cols;
  float* dscore = row.dscore;
  flex::HWY_NAMESPACE::EvaluateRow(rows, {t.q.b, t.q.h, row.i, 1, t.kv_begin}, row.mod_input,
                                   cols);
  const flex::GradientProgram& g = fg.program;
  for (int32_t id : g.program->outputs) flex::HWY_NAMESPACE::MaterializeLanes(rows, id);
  if (chunk >= 0) {
    for (size_t r = 0; r < g.reads.size(); ++r) {
      const float* adjoint = rows.floats(g.reads[r].adjoint);
      for (int64_t j = 0; j < cols; ++j) {
        if (dscore[j] == 0.0f) continue;
        int64_t index[8];
        for (size_t dim = 0; dim < g.reads[r].indices.size(); ++dim) {
          index[dim] = rows.ints(g.reads[r].indices[dim])[j];
        }
        fg.captured->add(chunk, r, index,
                         static_cast<double>(dscore[j]) * static_cast<double>(adjoint[j]));
      }
    }
  }
  const float* d_score = rows.floats(g.d_score);
  for (int64_t j = 0; j < cols; ++j) dscore[j] = dscore[j] == 0.0f ? 0.0f : dscore[j] * d_score[j];
}

// For pair t of `group`, leaves
//   ws.probs   = P o Z (dropped, rescaled probabilities: what multiplied v),
//   ws.dscores = dS = P o (Z o dP - D)  (the gradient of the scaled, masked scores,
//                times d(score_mod)/d(score) for flex calls).
// Masked and padding columns and fully masked rows get zeros in both. With t.chunk >= 0,
// also adds the flex captured-tensor gradients of these elements to that chunk.
void ProbsAndScoreGrads(const BackwardCall& call, const PackedBackwardGroup& group,
                        const BlockPair& t, FlashBackwardScratch& ws) {
  const AttentionParams& p = call.p;
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t L = p.q_len, S = p.kv_len;
  const int64_t b = t.q.b, h = t.q.h, q_begin = t.q.q_begin, rows = t.q.rows;
  const int64_t g = t.g, kv_begin = t.kv_begin, cols = t.cols, tile = kv_begin / kBlockKv;
  if (kBf16Target && group.bf16()) {
    Bf16GemmOn(ws.amx.active(), {rows, kBlockKv, group.e2() / 2},
               {group.q_bf16(g, q_begin), group.e2()}, group.k_dim_pairs(tile),
               {ws.probs, kBlockKv}, GemmOutput::kOverwrite);
    Bf16GemmOn(ws.amx.active(), {rows, kBlockKv, group.ev2() / 2},
               {group.dout_bf16(g, q_begin), group.ev2()}, group.v_dim_pairs(tile),
               {ws.dscores, kBlockKv}, GemmOutput::kOverwrite);
    // Unscaled bf16 q: the scale multiplies the float32 scores, as in the forward.
    for (int64_t r = 0; r < rows; ++r) {
      ScaleRow(ws.probs + r * kBlockKv, kBlockKv, call.scale);
    }
  } else {
    Gemm({rows, kBlockKv, p.head_dim_qk}, {group.q(g, q_begin), group.e_pad()},
         {group.k_t(tile), kBlockKv}, {ws.probs, kBlockKv}, GemmOutput::kOverwrite);
    Gemm({rows, kBlockKv, p.head_dim_vo}, {group.dout(g, q_begin), group.ev_pad()},
         {group.v_t(tile), kBlockKv}, {ws.dscores, kBlockKv}, GemmOutput::kOverwrite);
  }
  const DenseMaskRows dense(p.mask, b, h);
  const HeadMasking masking{p.mask, dense, &ws.flex, b, h, L, S};
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = q_begin + r;
    float* prob = ws.probs + r * kBlockKv;
    float* dscore = ws.dscores + r * kBlockKv;
    const float row_lse = lse_at(p.lse, b, h, i);
    if (is_masked_lse(row_lse)) {  // fully masked row: no gradient flows
      std::fill(prob, prob + kBlockKv, 0.0f);
      std::fill(dscore, dscore + kBlockKv, 0.0f);
      continue;
    }
    // The scores as score_mod saw them, kept only for its derivative.
    float* mod_input = call.flex_grad ? ws.mod_input + r * kBlockKv : nullptr;
    MaskScoreRow(masking, {i, row_columns(p.mask, b, i, L, S), kv_begin, cols}, prob, mod_input);
    const auto vlse = hn::Set(d, row_lse);
    const auto vdelta = hn::Set(d, call.delta[query_row_index(p, b, h, i)]);
    if (p.has_dropout()) {
      std::fill(ws.keep, ws.keep + kBlockKv, 1.0f);
      apply_dropout(p, {b, h, i, kv_begin}, ws.keep, cols);
    }
    const auto zero = hn::Zero(d);
    for (int64_t j = 0; j < kBlockKv; j += lanes) {
      // P <= 1: at huge scores (|s| ~ 1e7) the float32 lse is a few units off the
      // recomputed scores, and exp of a positive exponent would blow the gradients up.
      // The comparison keeps a NaN exponent NaN.
      const auto exponent = hn::Sub(hn::LoadU(d, prob + j), vlse);
      const auto pr = FastExp(d, hn::IfThenElse(hn::Gt(exponent, zero), zero, exponent));
      auto dp = hn::LoadU(d, dscore + j);
      auto pr_dropped = pr;
      if (p.has_dropout()) {
        const auto z = hn::LoadU(d, ws.keep + j);
        dp = hn::Mul(dp, z);
        pr_dropped = hn::Mul(pr, z);
      }
      hn::StoreU(hn::Mul(pr, hn::Sub(dp, vdelta)), d, dscore + j);
      hn::StoreU(pr_dropped, d, prob + j);
    }
    if (call.flex_grad) ChainThroughScoreMod(*call.flex_grad, t, {i, mod_input, dscore}, ws);
  }
}

// dQ (unscaled) += dS k for pair t, whose dS is in ws.dscores.
void AccumulateGradQ(const PackedBackwardGroup& group, const BlockPair& t,
                     FlashBackwardScratch& ws, float* dq) {
  const int64_t e_pad = group.e_pad(), tile = t.kv_begin / kBlockKv;
  const int64_t rows = t.q.rows, cols = t.cols;
  if (kBf16Target && group.bf16()) {
    for (int64_t r = 0; r < rows; ++r) {
      ConvertRowToBf16(ws.dscores + r * kBlockKv, ws.ds_bf16 + r * kBlockKv, kBlockKv);
    }
    Bf16GemmOn(ws.amx.active(), {rows, e_pad, (cols + 1) / 2}, {ws.ds_bf16, kBlockKv},
               group.k_key_pairs(tile), {dq, e_pad}, GemmOutput::kAccumulate);
    return;
  }
  Gemm({rows, e_pad, cols}, {ws.dscores, kBlockKv}, {group.k(tile), e_pad}, {dq, e_pad},
       GemmOutput::kAccumulate);
}

// dV += (P o Z)^T dO and dK += dS^T q for pair t, whose P o Z and dS are in ws.probs /
// ws.dscores; in bf16 mode dK misses the scale (the caller applies it).
void AccumulateGradKv(const PackedBackwardGroup& group, const BlockPair& t,
                      FlashBackwardScratch& ws) {
  const int64_t e_pad = group.e_pad(), ev_pad = group.ev_pad();
  const int64_t g = t.g, q_begin = t.q.q_begin, rows = t.q.rows, cols = t.cols;
  if (kBf16Target && group.bf16()) {
    // P^T and dS^T as A operands read from pairs over the q rows.
    for (int64_t r = 0; r < rows; r += 2) {
      const bool second = r + 1 < rows;
      const float* p0 = ws.probs + r * kBlockKv;
      const float* ds0 = ws.dscores + r * kBlockKv;
      ConvertRowPairToBf16(p0, second ? p0 + kBlockKv : nullptr, ws.p_pairs + r * kBlockKv,
                           kBlockKv);
      ConvertRowPairToBf16(ds0, second ? ds0 + kBlockKv : nullptr, ws.ds_pairs + r * kBlockKv,
                           kBlockKv);
    }
    const int64_t pairs = (rows + 1) / 2;
    Bf16GemmOn(ws.amx.active(), {cols, ev_pad, pairs}, {ws.p_pairs, 2, 2 * kBlockKv},
               group.dout_row_pairs(g, q_begin), {ws.dv, ev_pad}, GemmOutput::kAccumulate);
    Bf16GemmOn(ws.amx.active(), {cols, e_pad, pairs}, {ws.ds_pairs, 2, 2 * kBlockKv},
               group.q_row_pairs(g, q_begin), {ws.dk, e_pad}, GemmOutput::kAccumulate);
    return;
  }
  // P^T and dS^T read in place: element (c, r) at r * kBlockKv + c.
  Gemm({cols, ev_pad, rows}, {ws.probs, 1, kBlockKv}, {group.dout(g, q_begin), ev_pad},
       {ws.dv, ev_pad}, GemmOutput::kAccumulate);
  Gemm({cols, e_pad, rows}, {ws.dscores, 1, kBlockKv}, {group.q(g, q_begin), e_pad},
       {ws.dk, e_pad}, GemmOutput::kAccumulate);
}

// grad_q rows `q` = scale * dq (rows e_pad floats apart).
void StoreGradQ(const BackwardCall& call, const QueryTile& q, int64_t e_pad, float* dq) {
  const RowView dq_rows(call.grads.grad_q, q.b, q.h);
  for (int64_t r = 0; r < q.rows; ++r) {
    ScaleRow(dq + r * e_pad, e_pad, call.scale);
    dq_rows.store(q.q_begin + r, dq + r * e_pad);
  }
}

}  // namespace

void FlashKvBlockBackward(const BackwardCall& call, const PackedBackwardGroup& group,
                          const KvTile& kv, FlashBackwardScratch& ws, float* dq_acc) {
  const AttentionParams& p = call.p;
  const int64_t cols = std::min(kBlockKv, p.kv_len - kv.kv_begin);
  const int64_t e_pad = group.e_pad(), ev_pad = group.ev_pad();
  std::fill(ws.dk, ws.dk + cols * e_pad, 0.0f);
  std::fill(ws.dv, ws.dv + cols * ev_pad, 0.0f);
  for (int64_t g = 0; g < p.group_size(); ++g) {
    const int64_t h = kv.hk * p.group_size() + g;
    for (int64_t q_begin = 0; q_begin < p.q_len; q_begin += kBlockQ) {
      const int64_t rows = std::min(kBlockQ, p.q_len - q_begin);
      const BlockPair t{{kv.b, h, q_begin, rows}, g, kv.kv_begin, cols, -1};
      const KvTileRange tiles = VisibleKvTiles(p, &ws.flex, t.q);
      if (kv.kv_begin < tiles.first || kv.kv_begin >= tiles.end) continue;
      ProbsAndScoreGrads(call, group, t, ws);
      AccumulateGradKv(group, t, ws);
      // The same call as FlashQBlockBackward's, so the sums are bit-identical.
      if (dq_acc) AccumulateGradQ(group, t, ws, dq_acc + (g * p.q_len + q_begin) * e_pad);
    }
  }
  const RowView dk_rows(call.grads.grad_k, kv.b, kv.hk), dv_rows(call.grads.grad_v, kv.b, kv.hk);
  const bool unscaled_q = kBf16Target && group.bf16();
  for (int64_t c = 0; c < cols; ++c) {
    if (unscaled_q) ScaleRow(ws.dk + c * e_pad, e_pad, call.scale);
    dk_rows.store(kv.kv_begin + c, ws.dk + c * e_pad);
    dv_rows.store(kv.kv_begin + c, ws.dv + c * ev_pad);
  }
}

void FlashQBlockBackward(const BackwardCall& call, const PackedBackwardGroup& group,
                         const QueryTile& q, int64_t chunk, FlashBackwardScratch& ws) {
  const AttentionParams& p = call.p;
  const int64_t e_pad = group.e_pad();
  std::fill(ws.dq, ws.dq + q.rows * e_pad, 0.0f);
  const KvTileRange tiles = VisibleKvTiles(p, &ws.flex, q);
  for (int64_t kv_begin = tiles.first; kv_begin < tiles.end; kv_begin += kBlockKv) {
    const BlockPair t{q, q.h % p.group_size(), kv_begin, std::min(kBlockKv, p.kv_len - kv_begin),
                      chunk};
    ProbsAndScoreGrads(call, group, t, ws);
    AccumulateGradQ(group, t, ws, ws.dq);  // times scale below
  }
  StoreGradQ(call, q, e_pad, ws.dq);
}

void FlashHeadBackward(const BackwardCall& call, const PackedBackwardGroup& group,
                       const KvTile& head, FlashBackwardScratch& ws, float* dq_acc) {
  const AttentionParams& p = call.p;
  const int64_t e_pad = group.e_pad();
  std::fill(dq_acc, dq_acc + p.group_size() * p.q_len * e_pad, 0.0f);
  for (int64_t kv_begin = 0; kv_begin < p.kv_len; kv_begin += kBlockKv) {
    FlashKvBlockBackward(call, group, {head.b, head.hk, kv_begin}, ws, dq_acc);
  }
  for (int64_t g = 0; g < p.group_size(); ++g) {
    for (int64_t q_begin = 0; q_begin < p.q_len; q_begin += kBlockQ) {
      const QueryTile q{head.b, head.hk * p.group_size() + g, q_begin,
                        std::min(kBlockQ, p.q_len - q_begin)};
      StoreGradQ(call, q, e_pad, dq_acc + (g * p.q_len + q_begin) * e_pad);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {

FlashBackwardKernels flash_backward_kernels_for(Capability capability) {
  switch (capability) {
#if HWY_TARGETS & HWY_AVX3
    case Capability::kAVX512: return {&N_AVX3::FlashKvBlockBackward, &N_AVX3::FlashQBlockBackward,
                                          &N_AVX3::FlashHeadBackward};
#endif
#if HWY_TARGETS & HWY_AVX2
    case Capability::kAVX2: return {&N_AVX2::FlashKvBlockBackward, &N_AVX2::FlashQBlockBackward,
                                          &N_AVX2::FlashHeadBackward};
#endif
    default: break;
  }
#if HWY_TARGETS & HWY_EMU128
  return {&N_EMU128::FlashKvBlockBackward, &N_EMU128::FlashQBlockBackward,
          &N_EMU128::FlashHeadBackward};
#else
  return {&N_SCALAR::FlashKvBlockBackward, &N_SCALAR::FlashQBlockBackward,
          &N_SCALAR::FlashHeadBackward};
#endif
}

}  // namespace sdpa::cpu
#endif  // HWY_ONCE
