// MATH backward: the obvious gradient of softmax(mods(q k^T * scale)) (dropout) v, row by
// row with the probabilities recomputed from scratch. The reference for FLASH.

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "core/parallel.h"
#include "core/scratch.h"
#include "core/threading.h"
#include "cpu/flash_tile.h"
#include "cpu/kernel_context.h"
#include "cpu/kernels.h"
#include "cpu/mask_rows.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"
#include "cpu/score_mod_grad.h"

namespace sdpa::cpu {
namespace {

// One thread's buffers for one (batch, kv head) item.
template <typename Acc>
struct MathBackwardBuffers {
  explicit MathBackwardBuffers(const AttentionParams& p, const FlexBackward* grad)
      : q(p.head_dim_qk), dout(p.head_dim_vo), k(p.kv_len * p.head_dim_qk),
        v(p.kv_len * p.head_dim_vo), dk(p.kv_len * p.head_dim_qk), dv(p.kv_len * p.head_dim_vo),
        prob(p.kv_len), raw(p.kv_len), keep(p.kv_len), dprob(p.kv_len), dq(p.head_dim_qk),
        flex(p.mask, kMaxLanes) {
    if (grad) grad_eval.emplace(*grad->program.program, grad->program.captured);
  }
  detail::ScratchArray<Acc> q, dout, k, v, dk, dv, prob, raw, keep, dprob, dq;
  flex::RowState flex;
  std::optional<flex::ScalarEvaluator> grad_eval;
};

// Gradients of every query head of kv head hk's group; dK/dV summed over the group.
template <typename Acc>
void backward_kv_head(const AttentionParams& p, int64_t item, MathBackwardBuffers<Acc>& buf,
                      FlexBackward* grad, detail::BackwardOutputs& out) {
  const int64_t b = item / p.num_heads_kv, hk = item % p.num_heads_kv;
  const int64_t L = p.q_len, S = p.kv_len, E = p.head_dim_qk, Ev = p.head_dim_vo;
  const Acc scale = static_cast<Acc>(p.scale);
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  const RowView k_rows(p.k, b, hk), v_rows(p.v, b, hk);
  for (int64_t j = 0; j < S; ++j) {
    k_rows.load(j, buf.k.data() + j * E);
    v_rows.load(j, buf.v.data() + j * Ev);
  }
  std::fill(buf.dk.begin(), buf.dk.end(), Acc(0));
  std::fill(buf.dv.begin(), buf.dv.end(), Acc(0));
  for (int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
    const RowView q_rows(p.q, b, h), dout_rows(p.grad_out, b, h), dq_rows(out.grad_q, b, h);
    const DenseMaskRows dense(p.mask, b, h);
    const HeadMasking masking{p.mask, dense, &buf.flex, b, h, L, S};
    for (int64_t i = 0; i < L; ++i) {
      q_rows.load(i, buf.q.data());
      dout_rows.load(i, buf.dout.data());
      Acc* prob = buf.prob.data();
      for (int64_t j = 0; j < S; ++j) {
        Acc dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += buf.q[e] * buf.k[j * E + e];
        prob[j] = dot * scale;
      }
      mask_score_row(masking, i, prob, buf.raw.data());
      Acc max = neg_inf;
      for (int64_t j = 0; j < S; ++j) max = max_keeping_nan(max, prob[j]);
      std::fill(buf.dq.begin(), buf.dq.end(), Acc(0));
      Acc* ds = buf.dprob.data();
      if (!has_finite_score(max)) {  // fully masked row: no gradient flows
        std::fill(buf.dprob.begin(), buf.dprob.end(), Acc(0));
      } else {
        Acc sum = 0;
        for (int64_t j = 0; j < S; ++j) sum += (prob[j] = std::exp(prob[j] - max));
        for (int64_t j = 0; j < S; ++j) prob[j] /= sum;
        std::fill(buf.keep.begin(), buf.keep.end(), Acc(1));
        if (p.has_dropout()) apply_dropout(p, {b, h, i, 0}, buf.keep.data(), S);
        // dP_j = keep_j * (dO . v_j); D = sum_j P_j dP_j = rowsum(dO o O).
        Acc delta = 0;
        for (int64_t j = 0; j < S; ++j) {
          Acc dot = 0;
          for (int64_t e = 0; e < Ev; ++e) dot += buf.dout[e] * buf.v[j * Ev + e];
          ds[j] = buf.keep[j] * dot;
          delta += prob[j] * ds[j];
        }
        for (int64_t j = 0; j < S; ++j) {
          const Acc weight = prob[j] * buf.keep[j];
          for (int64_t e = 0; e < Ev; ++e) buf.dv[j * Ev + e] += weight * buf.dout[e];
          ds[j] = prob[j] * (ds[j] - delta);  // dL/d(score after score_mod)
          if (grad && prob[j] != Acc(0)) {  // chain rule through score_mod
            ds[j] = static_cast<Acc>(chain_score_mod(*grad, *buf.grad_eval,
                                                     static_cast<double>(buf.raw[j]), b, h, i, j,
                                                     static_cast<double>(ds[j]), item));
          }
          for (int64_t e = 0; e < E; ++e) {
            buf.dk[j * E + e] += scale * ds[j] * buf.q[e];
            buf.dq[e] += scale * ds[j] * buf.k[j * E + e];
          }
        }
      }
      dq_rows.store(i, buf.dq.data());
      if (out.grad_mask.defined()) RowView(out.grad_mask, b, h).store(i, ds);
    }
  }
  const RowView dk_rows(out.grad_k, b, hk), dv_rows(out.grad_v, b, hk);
  for (int64_t j = 0; j < S; ++j) {
    dk_rows.store(j, buf.dk.data() + j * E);
    dv_rows.store(j, buf.dv.data() + j * Ev);
  }
}

template <typename Acc>
void math_backward_typed(const AttentionParams& p, detail::BackwardOutputs& out) {
  // Parallel over (batch, kv head): each item owns its dK/dV rows, and captured-tensor
  // gradients go to the item's own partial buffer (one chunk per item), reduced in order.
  const int64_t items = p.batch * p.num_heads_kv;
  std::optional<FlexBackward> grad;
  if (p.mask.score_mod) {
    grad.emplace(FlexBackward{flex::differentiate(*p.mask.score_mod), std::nullopt});
    grad->captured.emplace(grad->program, p.mask.score_mod->captured(), items);
  }
  detail::ParallelErrors errors;
  const int threads = detail::ThreadingContext::current().threads_for(items, backward_work(p));
  detail::run_region(threads, [&] {
    std::optional<MathBackwardBuffers<Acc>> buf;
    errors.guard([&] { buf.emplace(p, grad ? &*grad : nullptr); });
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      if (buf) errors.guard([&] { backward_kv_head(p, item, *buf, grad ? &*grad : nullptr, out); });
    }
  });
  errors.rethrow();
  if (grad && grad->captured->active()) out.grad_captured = grad->captured->finish();
}

}  // namespace

void math_backward(const AttentionParams& params, detail::BackwardOutputs& outputs) {
  if (params.dtype == DType::kFloat64) {
    math_backward_typed<double>(params, outputs);
  } else {
    math_backward_typed<float>(params, outputs);
  }
}

}  // namespace sdpa::cpu
