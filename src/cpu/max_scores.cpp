// The row maxima of the scores MATH softmaxes: flex_attention's max_scores output
// (torch 2.15's AuxRequest(max_scores=True)). A pass of its own, so that no forward
// kernel carries an extra output: FLASH's running maxima are raised lazily and are not
// the exact row maxima anyway.

#include <limits>

#include "core/scratch.h"
#include "cpu/flash_tile.h"
#include "cpu/kernel_context.h"
#include "cpu/kv_rows.h"
#include "cpu/math_scores.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"
#include "flex/row_state.h"

namespace sdpa::cpu {
namespace {

// One thread's buffers: the keys of the current kv head, one query row and its scores.
template <typename Acc>
struct MaxBuffers {
  explicit MaxBuffers(const AttentionParams& p)
      : q(p.head_dim_qk), k(p.kv_len * p.head_dim_qk), scores(p.kv_len), flex(p.mask, kMaxLanes) {}
  detail::ScratchArray<Acc> q, k, scores;
  flex::RowState flex;
};

template <typename Acc>
void max_scores_typed(const AttentionParams& p, float* max_scores) {
  for_each_query_head<MaxBuffers<Acc>>(p, [&](int64_t bh, MaxBuffers<Acc>& buf) {
    const int64_t b = bh / p.num_heads_q, h = bh % p.num_heads_q, E = p.head_dim_qk;
    const RowView q_rows(p.q, b, h), k_rows = key_rows(p, b, h / p.group_size());
    const DenseMaskRows dense(p.mask, b, h);
    const HeadMasking masking{p.mask, dense, &buf.flex, b, h, p.q_len, p.kv_len};
    for (int64_t j = 0; j < p.kv_len; ++j) k_rows.load(j, buf.k.data() + j * E);
    for (int64_t i = 0; i < p.q_len; ++i) {
      q_rows.load(i, buf.q.data());
      masked_score_row(p, masking, i, buf.q.data(), buf.k.data(), buf.scores.data());
      Acc max = -std::numeric_limits<Acc>::infinity();
      for (int64_t j = 0; j < p.kv_len; ++j) max = max_keeping_nan(max, buf.scores[j]);
      max_scores[query_row_index(p, b, h, i)] = static_cast<float>(max);
    }
  });
}

}  // namespace

void math_max_scores(const AttentionParams& params, const Tensor& max_scores) {
  if (params.dtype == DType::kFloat64) {
    max_scores_typed<double>(params, max_scores.data<float>());
  } else {
    max_scores_typed<float>(params, max_scores.data<float>());
  }
}

}  // namespace sdpa::cpu
