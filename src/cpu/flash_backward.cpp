// CPU flash backward: threading, scratch and the rowsum(dO o O) pre-pass. The SIMD work
// is in flash_backward_tile.cc.

#include <algorithm>
#include <iterator>
#include <optional>
#include <vector>

#include "core/parallel.h"
#include "core/threading.h"
#include "cpu/flash_backward_tile.h"
#include "cpu/flash_f64.h"
#include "cpu/kernels.h"
#include "cpu/pack_backward.h"
#include "cpu/rows.h"

namespace sdpa::cpu {

FlashBackwardScratch::FlashBackwardScratch(const AttentionParams& params,
                                           const FlexBackward* flex_grad, bool bf16)
    : head_dim_qk_padded(round_up(params.head_dim_qk, kMaxLanes)),
      head_dim_vo_padded(round_up(std::max<int64_t>(params.head_dim_vo, 1), kMaxLanes)),
      flex(params.mask, kBlockKv),
      amx(bf16) {
  if (flex_grad) {
    grad_rows.emplace(*flex_grad->program.program, flex_grad->program.captured, kBlockKv);
  }
  const int64_t e_pad = head_dim_qk_padded, ev_pad = head_dim_vo_padded;
  // The bf16 tiles hold two elements per float slot.
  const int64_t tile = kBlockQ * kBlockKv, bf16_tile = bf16 ? tile / 2 : 0;
  const int64_t sizes[] = {tile,
                           tile,
                           kBlockKv * e_pad,
                           kBlockKv * ev_pad,
                           kBlockQ * e_pad,
                           kBlockKv,
                           std::max(params.head_dim_qk, params.head_dim_vo),
                           tile,
                           bf16_tile,
                           bf16_tile,
                           bf16_tile};
  float* p_pairs_slot = nullptr;
  float* ds_pairs_slot = nullptr;
  float* ds_bf16_slot = nullptr;
  float** slots[] = {&probs,     &dscores,      &dk,           &dv,          &dq,  &keep, &row,
                     &mod_input, &p_pairs_slot, &ds_pairs_slot, &ds_bf16_slot};
  static_assert(std::size(sizes) == std::size(slots));
  int64_t total = 0;
  for (int64_t s : sizes) total += round_up(s, kMaxLanes);
  buffer_ = Tensor::empty({total}, DType::kFloat32);
  float* next = buffer_.data<float>();
  for (size_t i = 0; i < std::size(slots); ++i) {
    *slots[i] = next;
    next += round_up(sizes[i], kMaxLanes);
  }
  p_pairs = reinterpret_cast<uint16_t*>(p_pairs_slot);
  ds_pairs = reinterpret_cast<uint16_t*>(ds_pairs_slot);
  ds_bf16 = reinterpret_cast<uint16_t*>(ds_bf16_slot);
}

namespace {

// delta[b, h, i] = sum_e dO[b, h, i, e] * O[b, h, i, e] (FlashAttention-2's D).
Tensor rowsum_dout_out(const AttentionParams& p, const detail::ThreadingContext& context) {
  Tensor delta = Tensor::empty({p.batch, p.num_heads_q, p.q_len}, DType::kFloat32);
  float* d = delta.data<float>();
  const int64_t Ev = p.head_dim_vo;
  // Memory-bound: reads dO and O once.
  const double bytes = 2.0 * static_cast<double>(p.batch * p.num_heads_q * p.q_len * Ev) *
                       static_cast<double>(element_size(p.out.dtype()));
  detail::ParallelErrors errors;
  detail::run_region(context.threads_for(p.batch * p.num_heads_q, {0, bytes}), [&] {
    std::vector<float> dout, out;
    errors.guard([&] {
      dout.resize(static_cast<size_t>(Ev));
      out.resize(static_cast<size_t>(Ev));
    });
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.num_heads_q; ++h) {
        if (errors.failed()) continue;
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
  });
  errors.rethrow();
  return delta;
}

// Above this much per-thread memory (packed group + dQ) over all threads, heads are not
// run whole by one thread.
constexpr int64_t kHeadPassBytes = int64_t{1} << 30;

// Whether each (batch, kv head) runs whole on one thread (FlashHeadBackward): the heads
// must keep the `threads` the work repays busy (a multiple of them, or enough heads that
// dynamic scheduling evens out the rest) and each thread then holds one group's packed
// copy and dQ. Both ways give the same bits, so this only chooses speed.
bool use_head_pass(const AttentionParams& p, int threads, bool bf16, bool captured_grads) {
  if (captured_grads) return false;
  const int64_t heads = p.batch * p.num_heads_kv;
  const int64_t dq_bytes =
      4 * p.group_size() * p.q_len * round_up(p.head_dim_qk, kMaxLanes);
  if (threads * (PackedBackwardGroup::bytes(p, bf16) + dq_bytes) > kHeadPassBytes) return false;
  return heads % threads == 0 || heads >= 4 * threads;
}

void head_pass(const BackwardCall& call, int threads, bool bf16,
               const FlashBackwardKernels& kernels, flex::PartialBlockBits& partial_bits) {
  const AttentionParams& p = call.p;
  detail::ParallelErrors errors;
  detail::run_region(threads, [&] {
    std::optional<FlashBackwardScratch> scratch;
    std::optional<PackedBackwardGroup> group;
    Tensor dq_acc;
    errors.guard([&] {
      scratch.emplace(p, call.flex_grad, bf16);
      scratch->flex.partial_bits = &partial_bits;
      group.emplace(p, bf16);
      dq_acc = Tensor::empty({p.group_size() * p.q_len * group->e_pad()}, DType::kFloat32);
    });
    const int64_t q_blocks = (p.q_len + kBlockQ - 1) / kBlockQ;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bhk = 0; bhk < p.batch * p.num_heads_kv; ++bhk) {
      if (!dq_acc.defined()) continue;  // the thread's scratch could not be made
      errors.guard([&] {
        const int64_t b = bhk / p.num_heads_kv, hk = bhk % p.num_heads_kv;
        for (int64_t t = 0; t < group->num_tiles(); ++t) group->pack_kv(p, b, hk, t, scratch->row);
        for (int64_t qi = 0; qi < p.group_size() * q_blocks; ++qi) {
          group->pack_q(p, b, hk, qi / q_blocks, (qi % q_blocks) * kBlockQ);
        }
        kernels.head(call, *group, {b, hk, 0}, *scratch, dq_acc.data<float>());
      });
    }
  });
  errors.rethrow();
}

}  // namespace

// S = Q K^T, dP = dO V^T, dV += P^T dO, dK += dS^T Q and dQ += dS K: 2 L S (3 E + 2 Ev)
// per query head; k and v read as in the forward.
detail::Work backward_work(const AttentionParams& p) {
  const double flops = 2.0 * static_cast<double>(p.batch * p.num_heads_q) *
                       static_cast<double>(p.q_len) * static_cast<double>(p.kv_len) *
                       static_cast<double>(3 * p.head_dim_qk + 2 * p.head_dim_vo);
  return {flops, forward_work(p).bytes};
}

void flash_backward(const AttentionParams& p, detail::BackwardOutputs& out) {
  if (p.dtype == DType::kFloat64) return flash_backward_f64(p, out);
  // Both read the calling thread's capability (a per-thread override in tests).
  const FlashBackwardKernels kernels = flash_backward_kernels_for(active_capability());
  const bool bf16 = uses_bf16_dot(p);
  const detail::ThreadingContext context = detail::ThreadingContext::current();
  const Tensor delta = rowsum_dout_out(p, context);
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
  const BackwardCall call{p, delta.data<float>(), fg, out, static_cast<float>(p.scale)};
  const detail::Work work = backward_work(p);
  const int head_threads = context.threads_for(p.batch * p.num_heads_kv, work);
  flex::PartialBlockBits partial_bits(p.mask.block_mask.get());
  if (use_head_pass(p, head_threads, bf16, fg && fg->captured->active())) {
    return head_pass(call, head_threads, bf16, kernels, partial_bits);
  }
  PackedBackwardGroup group(p, bf16);
  detail::ParallelErrors errors;
  // Per (batch, kv head): pack, then pass 1 over its kv tiles, then pass 2 over the q
  // blocks of its query heads. Every item writes disjoint rows and sums in a fixed order,
  // so results are bit-identical for any thread count. Its loops have at most
  // max(kv_blocks, chunks) items each.
  const int threads = context.threads_for(std::max(kv_blocks, chunks), work);
  detail::run_region(threads, [&] {
    std::optional<FlashBackwardScratch> scratch;
    errors.guard([&] {
      scratch.emplace(p, fg, bf16);
      scratch->flex.partial_bits = &partial_bits;
    });
    for (int64_t bhk = 0; bhk < p.batch * p.num_heads_kv; ++bhk) {
      const int64_t b = bhk / p.num_heads_kv, hk = bhk % p.num_heads_kv;
#pragma omp for schedule(static)
      for (int64_t item = 0; item < kv_blocks + group_items; ++item) {
        if (!scratch) continue;
        errors.guard([&] {
          if (item < kv_blocks) {
            group.pack_kv(p, b, hk, item, scratch->row);
          } else {
            const int64_t qi = item - kv_blocks;
            group.pack_q(p, b, hk, qi / q_blocks, (qi % q_blocks) * kBlockQ);
          }
        });
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t jb = 0; jb < kv_blocks; ++jb) {
        if (!scratch) continue;
        errors.guard(
            [&] { kernels.kv_block(call, group, {b, hk, jb * kBlockKv}, *scratch, nullptr); });
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        if (!scratch) continue;
        errors.guard([&] {
          for (int64_t item = chunk * group_items / chunks;
               item < (chunk + 1) * group_items / chunks; ++item) {
            const int64_t q_begin = (item % q_blocks) * kBlockQ;
            const QueryTile q{b, hk * p.group_size() + item / q_blocks, q_begin,
                              std::min(kBlockQ, p.q_len - q_begin)};
            kernels.q_block(call, group, q, chunk, *scratch);
          }
        });
      }
    }
  });
  errors.rethrow();
  if (fg && fg->captured->active()) out.grad_captured = fg->captured->finish();
}

}  // namespace sdpa::cpu
