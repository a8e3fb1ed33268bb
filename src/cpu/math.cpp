// MATH backend: the obvious algorithm, materializing the [L, S] scores of one
// (batch, head) at a time. The reference every other backend is checked against.

#include <cmath>
#include <limits>

#include "core/scratch.h"
#include "cpu/flash_tile.h"
#include "cpu/kernel_context.h"
#include "cpu/kv_rows.h"
#include "cpu/math_scores.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"

namespace sdpa::cpu {
namespace {

// One thread's buffers: k and v of the current kv head, one score row, one output row
// and its float64 sums.
template <typename Acc>
struct MathBuffers {
  MathBuffers(const AttentionParams& p)
      : q(p.head_dim_qk),
        k(p.kv_len * p.head_dim_qk),
        v(p.kv_len * p.head_dim_vo),
        scores(p.kv_len),
        o(p.head_dim_vo),
        o_sum(p.head_dim_vo),
        flex(p.mask, kMaxLanes) {}
  detail::ScratchArray<Acc> q, k, v, scores, o;
  detail::ScratchArray<double> o_sum;
  flex::RowState flex;
};

// Rows of out and lse for one (batch, query head) bh = b * Hq + h.
template <typename Acc>
void forward_head(const AttentionParams& p, int64_t bh, MathBuffers<Acc>& buf, const Tensor& out,
                  float* lse) {
  const int64_t b = bh / p.num_heads_q, h = bh % p.num_heads_q;
  const int64_t L = p.q_len, S = p.kv_len, E = p.head_dim_qk, Ev = p.head_dim_vo;
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  const int64_t hk = h / p.group_size();
  const RowView q_rows(p.q, b, h), k_rows = key_rows(p, b, hk), v_rows = value_rows(p, b, hk);
  const RowView out_rows(out, b, h);
  const DenseMaskRows dense(p.mask, b, h);
  const HeadMasking masking{p.mask, dense, &buf.flex, b, h, L, S};
  for (int64_t j = 0; j < S; ++j) {
    k_rows.load(j, buf.k.data() + j * E);
    v_rows.load(j, buf.v.data() + j * Ev);
  }
  for (int64_t i = 0; i < L; ++i) {
    q_rows.load(i, buf.q.data());
    Acc* s = buf.scores.data();
    masked_score_row(p, masking, i, buf.q.data(), buf.k.data(), s);
    Acc max = neg_inf;
    for (int64_t j = 0; j < S; ++j) max = max_keeping_nan(max, s[j]);
    const int64_t row = query_row_index(p, b, h, i);
    if (!has_finite_score(max)) {  // fully masked row: zeros and lse = -inf
      std::fill(buf.o.begin(), buf.o.end(), Acc(0));
      lse[row] = kMaskedLse<float>;
      out_rows.store(i, buf.o.data());
      continue;
    }
    // The sums over the S keys run in float64 for every dtype: in float32 a row's
    // rounding errors grow with S (1.2e-5 relative at S = 65536, against 4e-7 summed wide).
    double sum = 0;
    for (int64_t j = 0; j < S; ++j) {
      s[j] = std::exp(s[j] - max);
      sum += s[j];
    }
    lse[row] = static_cast<float>(finalize<double>(max, sum).lse);
    for (int64_t j = 0; j < S; ++j) s[j] = static_cast<Acc>(s[j] / sum);
    if (p.has_dropout()) apply_dropout(p, {b, h, i, 0}, s, S);
    std::fill(buf.o_sum.begin(), buf.o_sum.end(), 0.0);
    for (int64_t j = 0; j < S; ++j) {
      const double p_j = s[j];
      for (int64_t e = 0; e < Ev; ++e) buf.o_sum[e] += p_j * buf.v[j * Ev + e];
    }
    for (int64_t e = 0; e < Ev; ++e) buf.o[e] = static_cast<Acc>(buf.o_sum[e]);
    out_rows.store(i, buf.o.data());
  }
}

template <typename Acc>
void math_forward_typed(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  for_each_query_head<MathBuffers<Acc>>(p, [&](int64_t bh, MathBuffers<Acc>& buf) {
    forward_head(p, bh, buf, out, lse.data<float>());
  });
}

}  // namespace

void math_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse) {
  if (params.reduced_precision_math) return math_forward_reduced(params, out, lse);
  if (params.dtype == DType::kFloat64) {
    math_forward_typed<double>(params, out, lse);
  } else {
    math_forward_typed<float>(params, out, lse);
  }
}

}  // namespace sdpa::cpu
