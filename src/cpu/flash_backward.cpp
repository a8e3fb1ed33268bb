// CPU flash backward: threading, scratch and the rowsum(dO o O) pre-pass. The SIMD work
// is in flash_backward_tile.cc.

#include <algorithm>
#include <iterator>
#include <vector>

#include "cpu/flash_backward_tile.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace sdpa::cpu {

FlashBackwardScratch::FlashBackwardScratch(int64_t head_dim_qk, int64_t head_dim_vo)
    : head_dim_qk_padded(round_up(head_dim_qk, kMaxLanes)),
      head_dim_vo_padded(round_up(std::max<int64_t>(head_dim_vo, 1), kMaxLanes)) {
  const int64_t e_pad = head_dim_qk_padded, ev_pad = head_dim_vo_padded;
  const int64_t sizes[] = {kBlockQ * e_pad,           kBlockQ * ev_pad,
                           head_dim_qk * kBlockKv,    kBlockKv * e_pad,
                           head_dim_vo * kBlockKv,    kBlockQ * kBlockKv,
                           kBlockQ * kBlockKv,        kBlockKv * kBlockQ,
                           kBlockKv * kBlockQ,        kBlockKv * e_pad,
                           kBlockKv * ev_pad,         kBlockQ * e_pad,
                           kBlockKv,                  std::max(head_dim_qk, head_dim_vo)};
  float** slots[] = {&q,       &dout,    &k_t, &k,  &v_t,  &probs, &dscores,
                     &probs_t, &dscores_t, &dk, &dv, &dq, &keep, &row};
  static_assert(std::size(sizes) == std::size(slots));
  int64_t total = 0;
  for (int64_t s : sizes) total += round_up(s, kMaxLanes);
  buffer_ = Tensor::empty({total}, DType::kFloat32);
  float* next = buffer_.data<float>();
  for (size_t i = 0; i < std::size(slots); ++i) {
    *slots[i] = next;
    next += round_up(sizes[i], kMaxLanes);
  }
}

namespace {

// delta[b, h, i] = sum_e dO[b, h, i, e] * O[b, h, i, e] (FlashAttention-2's D).
Tensor rowsum_dout_out(const AttentionParams& p) {
  Tensor delta = Tensor::empty({p.batch, p.num_heads_q, p.q_len}, DType::kFloat32);
  float* d = delta.data<float>();
  const int64_t Ev = p.head_dim_vo;
#pragma omp parallel
  {
    std::vector<float> dout(Ev), out(Ev);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.num_heads_q; ++h) {
        const RowView dout_rows(p.grad_out, b, h), out_rows(p.out, b, h);
        for (int64_t i = 0; i < p.q_len; ++i) {
          dout_rows.load(i, dout.data());
          out_rows.load(i, out.data());
          float sum = 0.0f;
          for (int64_t e = 0; e < Ev; ++e) sum += dout[e] * out[e];
          d[(b * p.num_heads_q + h) * p.q_len + i] = sum;
        }
      }
    }
  }
  return delta;
}

}  // namespace

void flash_backward(const AttentionParams& p, const Tensor& grad_q, const Tensor& grad_k,
                    const Tensor& grad_v, const Tensor&) {
  const FlashBackwardKernels kernels = flash_backward_kernels_for(active_capability());
  const Tensor delta = rowsum_dout_out(p);
  const float* d = delta.data<float>();
  const int64_t kv_blocks = (p.kv_len + kBlockKv - 1) / kBlockKv;
  const int64_t q_blocks = (p.q_len + kBlockQ - 1) / kBlockQ;
  const int64_t kv_items = p.batch * p.num_heads_kv * kv_blocks;
  const int64_t q_items = p.batch * p.num_heads_q * q_blocks;
  // Every item writes disjoint rows and sums in a fixed order, so results are
  // bit-identical for any thread count.
#pragma omp parallel
  {
    FlashBackwardScratch scratch(p.head_dim_qk, p.head_dim_vo);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < kv_items; ++item) {
      const int64_t jb = item % kv_blocks, bh = item / kv_blocks;
      kernels.kv_block(p, d, bh / p.num_heads_kv, bh % p.num_heads_kv, jb * kBlockKv, scratch,
                       grad_k, grad_v);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < q_items; ++item) {
      const int64_t qb = item % q_blocks, bh = item / q_blocks;
      kernels.q_block(p, d, bh / p.num_heads_q, bh % p.num_heads_q, qb * kBlockQ, scratch,
                      grad_q);
    }
  }
}

}  // namespace sdpa::cpu
