// MATH backend: the obvious algorithm, materializing the [L, S] scores of one
// (batch, head) at a time. The reference every other backend is checked against.

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
void math_forward_typed(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const int64_t L = p.q_len, S = p.kv_len, E = p.head_dim_qk, Ev = p.head_dim_vo;
  const Acc scale = static_cast<Acc>(p.scale);
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  float* lse_data = lse.data<float>();
#pragma omp parallel
  {
    std::vector<Acc> q(E), k(S * E), v(S * Ev), scores(S), o(Ev);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.num_heads_q; ++h) {
        const int64_t hk = h / p.group_size();
        const RowView q_rows(p.q, b, h), k_rows(p.k, b, hk), v_rows(p.v, b, hk);
        const RowView out_rows(out, b, h);
        const DenseMaskRows dense(p.mask, b, h);
        for (int64_t j = 0; j < S; ++j) {
          k_rows.load(j, k.data() + j * E);
          v_rows.load(j, v.data() + j * Ev);
        }
        for (int64_t i = 0; i < L; ++i) {
          q_rows.load(i, q.data());
          for (int64_t j = 0; j < S; ++j) {
            Acc dot = 0;
            for (int64_t e = 0; e < E; ++e) dot += q[e] * k[j * E + e];
            scores[j] = dot * scale;
          }
          mask_score_row(p.mask, dense, b, h, i, L, S, scores.data());
          Acc max = neg_inf;
          for (int64_t j = 0; j < S; ++j) max = std::max(max, scores[j]);
          const int64_t row = (b * p.num_heads_q + h) * L + i;
          std::fill(o.begin(), o.end(), Acc(0));
          if (max == neg_inf) {  // fully masked row: zeros and lse = -inf
            lse_data[row] = -std::numeric_limits<float>::infinity();
            out_rows.store(i, o.data());
            continue;
          }
          Acc sum = 0;
          for (int64_t j = 0; j < S; ++j) {
            scores[j] = std::exp(scores[j] - max);
            sum += scores[j];
          }
          lse_data[row] = static_cast<float>(max + std::log(sum));
          for (int64_t j = 0; j < S; ++j) scores[j] /= sum;
          if (p.has_dropout()) {
            DropoutStream(p.dropout.philox, p.dropout.p)
                .apply(static_cast<uint64_t>(row * S), scores.data(), S);
          }
          for (int64_t j = 0; j < S; ++j) {
            const Acc w = scores[j];
            for (int64_t e = 0; e < Ev; ++e) o[e] += w * v[j * Ev + e];
          }
          out_rows.store(i, o.data());
        }
      }
    }
  }
}

}  // namespace

void math_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse) {
  if (params.dtype == DType::kFloat64) {
    math_forward_typed<double>(params, out, lse);
  } else {
    math_forward_typed<float>(params, out, lse);
  }
}

}  // namespace sdpa::cpu
