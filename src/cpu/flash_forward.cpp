// CPU flash forward: threading and scratch. The SIMD work is in flash_tile.cc.

#include <algorithm>
#include <iterator>

#include "core/parallel.h"
#include "cpu/flash_tile.h"
#include "cpu/kernels.h"

namespace sdpa::cpu {

FlashScratch::FlashScratch(const AttentionParams& params)
    : head_dim_vo_padded(round_up(std::max<int64_t>(params.head_dim_vo, 1), kMaxLanes)),
      flex(params.mask, kBlockKv) {
  const int64_t head_dim_qk = params.head_dim_qk, head_dim_vo = params.head_dim_vo;
  const int64_t sizes[] = {kBlockQ * head_dim_qk,       head_dim_qk * kBlockKv,
                           kBlockKv * head_dim_vo_padded, kBlockQ * kBlockKv,
                           kBlockQ * head_dim_vo_padded, kBlockQ,
                           kBlockQ,
                           std::max(head_dim_qk, head_dim_vo)};
  int64_t total = 0;
  for (int64_t s : sizes) total += round_up(s, kMaxLanes);
  buffer_ = Tensor::empty({total}, DType::kFloat32);
  float* next = buffer_.data<float>();
  float** slots[] = {&q, &k_t, &v, &scores, &acc, &row_max, &row_sum, &row};
  for (size_t i = 0; i < std::size(slots); ++i) {
    *slots[i] = next;
    next += round_up(sizes[i], kMaxLanes);
  }
}

FlashScratch::~FlashScratch() = default;

void flash_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const FlashQBlockFn q_block = flash_q_block_for(active_capability());
  const int64_t q_blocks = (p.q_len + kBlockQ - 1) / kBlockQ;
  const int64_t items = p.batch * p.num_heads_q * q_blocks;
  if (items == 0) return;
  // One work item per (batch, head, q-block); dynamic scheduling balances causal masks,
  // whose later q-blocks see more keys.
  detail::ParallelErrors errors;
#pragma omp parallel
  {
    FlashScratch scratch(p);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      try {
        const int64_t qb = item % q_blocks;
        const int64_t bh = item / q_blocks;
        q_block(p, bh / p.num_heads_q, bh % p.num_heads_q, qb * kBlockQ, scratch, out, lse);
      } catch (...) {
        errors.capture();
      }
    }
  }
  errors.rethrow();
}

}  // namespace sdpa::cpu
