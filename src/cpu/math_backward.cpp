// MATH backward: the obvious gradient of softmax(q k^T * scale + mask) (dropout) v, row
// by row with the probabilities recomputed from scratch. The reference for FLASH.

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/mask_rows.h"
#include "cpu/philox.h"
#include "cpu/rows.h"

namespace sdpa::cpu {
namespace {

template <typename Acc>
void math_backward_typed(const AttentionParams& p, const Tensor& grad_q, const Tensor& grad_k,
                         const Tensor& grad_v, const Tensor& grad_mask) {
  const int64_t L = p.q_len, S = p.kv_len, E = p.head_dim_qk, Ev = p.head_dim_vo;
  const Acc scale = static_cast<Acc>(p.scale);
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  // Parallel over (batch, kv head): each item owns its dK/dV, so no accumulation races.
#pragma omp parallel
  {
    std::vector<Acc> q(E), dout(Ev), k(S * E), v(S * Ev), dk(S * E), dv(S * Ev);
    std::vector<Acc> prob(S), keep(S), dprob(S), dq(E);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t hk = 0; hk < p.num_heads_kv; ++hk) {
        const RowView k_rows(p.k, b, hk), v_rows(p.v, b, hk);
        for (int64_t j = 0; j < S; ++j) {
          k_rows.load(j, k.data() + j * E);
          v_rows.load(j, v.data() + j * Ev);
        }
        std::fill(dk.begin(), dk.end(), Acc(0));
        std::fill(dv.begin(), dv.end(), Acc(0));
        for (int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
          const RowView q_rows(p.q, b, h), dout_rows(p.grad_out, b, h), dq_rows(grad_q, b, h);
          const DenseMaskRows dense(p.mask, b, h);
          for (int64_t i = 0; i < L; ++i) {
            q_rows.load(i, q.data());
            dout_rows.load(i, dout.data());
            for (int64_t j = 0; j < S; ++j) {
              Acc dot = 0;
              for (int64_t e = 0; e < E; ++e) dot += q[e] * k[j * E + e];
              prob[j] = dot * scale;
            }
            mask_score_row(p.mask, dense, b, h, i, L, S, prob.data());
            Acc max = neg_inf;
            for (int64_t j = 0; j < S; ++j) max = std::max(max, prob[j]);
            const int64_t row = (b * p.num_heads_q + h) * L + i;
            std::fill(dq.begin(), dq.end(), Acc(0));
            if (max == neg_inf) {  // fully masked row: no gradient flows
              std::fill(dprob.begin(), dprob.end(), Acc(0));
            } else {
              Acc sum = 0;
              for (int64_t j = 0; j < S; ++j) sum += (prob[j] = std::exp(prob[j] - max));
              for (int64_t j = 0; j < S; ++j) prob[j] /= sum;
              std::fill(keep.begin(), keep.end(), Acc(1));
              if (p.has_dropout()) {
                DropoutStream(p.dropout.philox, p.dropout.p)
                    .apply(static_cast<uint64_t>(row * S), keep.data(), S);
              }
              // dP_j = keep_j * (dO . v_j); D = sum_j P_j dP_j = rowsum(dO o O).
              Acc delta = 0;
              for (int64_t j = 0; j < S; ++j) {
                Acc dot = 0;
                for (int64_t e = 0; e < Ev; ++e) dot += dout[e] * v[j * Ev + e];
                dprob[j] = keep[j] * dot;
                delta += prob[j] * dprob[j];
              }
              for (int64_t j = 0; j < S; ++j) {
                const Acc ds = prob[j] * (dprob[j] - delta);  // dL/d(score_j)
                const Acc weight = prob[j] * keep[j];
                for (int64_t e = 0; e < Ev; ++e) dv[j * Ev + e] += weight * dout[e];
                for (int64_t e = 0; e < E; ++e) {
                  dk[j * E + e] += scale * ds * q[e];
                  dq[e] += scale * ds * k[j * E + e];
                }
                dprob[j] = ds;
              }
            }
            dq_rows.store(i, dq.data());
            if (grad_mask.defined()) RowView(grad_mask, b, h).store(i, dprob.data());
          }
        }
        const RowView dk_rows(grad_k, b, hk), dv_rows(grad_v, b, hk);
        for (int64_t j = 0; j < S; ++j) {
          dk_rows.store(j, dk.data() + j * E);
          dv_rows.store(j, dv.data() + j * Ev);
        }
      }
    }
  }
}

}  // namespace

void math_backward(const AttentionParams& params, const Tensor& grad_q, const Tensor& grad_k,
                   const Tensor& grad_v, const Tensor& grad_mask) {
  if (params.dtype == DType::kFloat64) {
    math_backward_typed<double>(params, grad_q, grad_k, grad_v, grad_mask);
  } else {
    math_backward_typed<float>(params, grad_q, grad_k, grad_v, grad_mask);
  }
}

}  // namespace sdpa::cpu
