// CPU flash backward: threading, scratch and the rowsum(dO o O) pre-pass. The SIMD work
// is in flash_backward_tile.cc.

#include <algorithm>
#include <iterator>
#include <vector>

#include "core/parallel.h"
#include "cpu/flash_backward_tile.h"
#include "cpu/kernels.h"
#include "cpu/pack.h"
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
  const int64_t e_pad = head_dim_qk_padded, ev_pad = head_dim_vo_padded;
  const int64_t sizes[] = {kBlockQ * kBlockKv, kBlockQ * kBlockKv, kBlockKv * kBlockQ,
                           kBlockKv * kBlockQ, kBlockKv * e_pad,   kBlockKv * ev_pad,
                           kBlockQ * e_pad,    kBlockKv,
                           std::max(params.head_dim_qk, params.head_dim_vo),
                           kBlockQ * kBlockKv};
  float** slots[] = {&probs, &dscores, &probs_t, &dscores_t, &dk,
                     &dv,    &dq,      &keep,    &row,       &mod_input};
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
  // Captured-tensor gradients are summed per chunk of consecutive q items of a group; each
  // chunk runs on one thread in item order, groups one after another
  // (flex/captured_grads.h), so the sums do not depend on the thread count.
  const int64_t group_items = p.group_size() * q_blocks;
  const int64_t chunks = flex::CapturedGrads::num_chunks(group_items);
  std::optional<FlexBackward> flex_grad;
  if (p.mask.score_mod) {
    flex_grad.emplace(FlexBackward{flex::differentiate(*p.mask.score_mod), std::nullopt});
    flex_grad->captured.emplace(flex_grad->program, p.mask.score_mod->captured(), chunks);
  }
  FlexBackward* fg = flex_grad ? &*flex_grad : nullptr;
  PackedBackwardGroup group(p);
  detail::ParallelErrors errors;
  // Per (batch, kv head): pack, then pass 1 over its kv tiles, then pass 2 over the q
  // blocks of its query heads. Every item writes disjoint rows and sums in a fixed order,
  // so results are bit-identical for any thread count.
#pragma omp parallel
  {
    FlashBackwardScratch scratch(p, fg);
    for (int64_t bhk = 0; bhk < p.batch * p.num_heads_kv; ++bhk) {
      const int64_t b = bhk / p.num_heads_kv, hk = bhk % p.num_heads_kv;
#pragma omp for schedule(static)
      for (int64_t item = 0; item < kv_blocks + group_items; ++item) {
        try {
          if (item < kv_blocks) {
            group.pack_kv(p, b, hk, item, scratch.row);
          } else {
            const int64_t qi = item - kv_blocks;
            group.pack_q(p, b, hk, qi / q_blocks, (qi % q_blocks) * kBlockQ);
          }
        } catch (...) {
          errors.capture();
        }
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t jb = 0; jb < kv_blocks; ++jb) {
        try {
          kernels.kv_block(p, group, d, fg, b, hk, jb * kBlockKv, scratch, out.grad_k,
                           out.grad_v);
        } catch (...) {
          errors.capture();
        }
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        try {
          for (int64_t item = chunk * group_items / chunks;
               item < (chunk + 1) * group_items / chunks; ++item) {
            kernels.q_block(p, group, d, fg, chunk, b, hk * p.group_size() + item / q_blocks,
                            (item % q_blocks) * kBlockQ, scratch, out.grad_q);
          }
        } catch (...) {
          errors.capture();
        }
      }
    }
  }
  errors.rethrow();
  if (fg && fg->captured->active()) out.grad_captured = fg->captured->finish();
}

}  // namespace sdpa::cpu
