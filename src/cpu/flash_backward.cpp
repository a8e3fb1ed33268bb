// CPU flash backward: threading, scratch and the rowsum(dO o O) pre-pass. The SIMD work
// is in flash_backward_tile.cc.

#include <algorithm>
#include <iterator>
#include <vector>

#include "core/parallel.h"
#include "cpu/flash_backward_tile.h"
#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace sdpa::cpu {

FlashBackwardScratch::FlashBackwardScratch(const AttentionParams& params,
                                           const FlexBackward* flex_grad)
    : head_dim_qk_padded(round_up(params.head_dim_qk, kMaxLanes)),
      head_dim_vo_padded(round_up(std::max<int64_t>(params.head_dim_vo, 1), kMaxLanes)),
      flex(params.mask, kBlockKv) {
  if (flex_grad) {
    grad_rows.emplace(*flex_grad->program.program, flex_grad->program.captured, kBlockKv);
  }
  const int64_t head_dim_qk = params.head_dim_qk, head_dim_vo = params.head_dim_vo;
  const int64_t e_pad = head_dim_qk_padded, ev_pad = head_dim_vo_padded;
  const int64_t sizes[] = {kBlockQ * e_pad,           kBlockQ * ev_pad,
                           head_dim_qk * kBlockKv,    kBlockKv * e_pad,
                           head_dim_vo * kBlockKv,    kBlockQ * kBlockKv,
                           kBlockQ * kBlockKv,        kBlockKv * kBlockQ,
                           kBlockKv * kBlockQ,        kBlockKv * e_pad,
                           kBlockKv * ev_pad,         kBlockQ * e_pad,
                           kBlockKv,                  std::max(head_dim_qk, head_dim_vo),
                           kBlockQ * kBlockKv};
  float** slots[] = {&q,       &dout,      &k_t, &k,  &v_t,  &probs, &dscores,   &probs_t,
                     &dscores_t, &dk,      &dv,  &dq, &keep, &row,   &mod_input};
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

void flash_backward(const AttentionParams& p, detail::BackwardOutputs& out) {
  const FlashBackwardKernels kernels = flash_backward_kernels_for(active_capability());
  const Tensor delta = rowsum_dout_out(p);
  const float* d = delta.data<float>();
  const int64_t kv_blocks = (p.kv_len + kBlockKv - 1) / kBlockKv;
  const int64_t q_blocks = (p.q_len + kBlockQ - 1) / kBlockQ;
  const int64_t kv_items = p.batch * p.num_heads_kv * kv_blocks;
  const int64_t q_items = p.batch * p.num_heads_q * q_blocks;
  // Captured-tensor gradients are summed per chunk of consecutive q items; each chunk runs
  // on one thread in item order (flex/captured_grads.h).
  const int64_t chunks = flex::CapturedGrads::num_chunks(q_items);
  std::optional<FlexBackward> flex_grad;
  if (p.mask.score_mod) {
    flex_grad.emplace(FlexBackward{flex::differentiate(*p.mask.score_mod), std::nullopt});
    flex_grad->captured.emplace(flex_grad->program, p.mask.score_mod->captured(), chunks);
  }
  FlexBackward* fg = flex_grad ? &*flex_grad : nullptr;
  // Every item writes disjoint rows and sums in a fixed order, so results are
  // bit-identical for any thread count.
  detail::ParallelErrors errors;
#pragma omp parallel
  {
    FlashBackwardScratch scratch(p, fg);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < kv_items; ++item) {
      try {
        const int64_t jb = item % kv_blocks, bh = item / kv_blocks;
        kernels.kv_block(p, d, fg, bh / p.num_heads_kv, bh % p.num_heads_kv, jb * kBlockKv,
                         scratch, out.grad_k, out.grad_v);
      } catch (...) {
        errors.capture();
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      try {
        for (int64_t item = chunk * q_items / chunks; item < (chunk + 1) * q_items / chunks;
             ++item) {
          const int64_t qb = item % q_blocks, bh = item / q_blocks;
          kernels.q_block(p, d, fg, chunk, bh / p.num_heads_q, bh % p.num_heads_q,
                          qb * kBlockQ, scratch, out.grad_q);
        }
      } catch (...) {
        errors.capture();
      }
    }
  }
  errors.rethrow();
  if (fg && fg->captured->active()) out.grad_captured = fg->captured->finish();
}

}  // namespace sdpa::cpu
