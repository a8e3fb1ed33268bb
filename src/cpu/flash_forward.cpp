// CPU flash forward: threading and scratch. The SIMD work is in flash_tile.cc.

#include <algorithm>
#include <atomic>
#include <iterator>
#include <optional>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "core/threading.h"
#include "cpu/bf16_dot.h"
#include "cpu/flash_decode.h"
#include "cpu/flash_f64.h"
#include "cpu/flash_tile.h"
#include "cpu/kernels.h"
#include "cpu/pack.h"

namespace sdpa::cpu {

bool uses_bf16_dot(const AttentionParams& p) {
  // vdpbf16ps reads k and v as stored: a float8 cache (KvDequant) goes through float32.
  return p.q.dtype() == DType::kBFloat16 && p.k.dtype() == DType::kBFloat16 &&
         active_capability() == Capability::kAVX512 &&
         bf16_dot_available();
}

bool decode_uses_bf16_dot(const AttentionParams& p) {
  // The decode kernels widen float8 codes with AVX512_VBMI's byte permutes (e4m3_bf16.h).
  return vbmi_available() &&
         (uses_bf16_dot(p) ||
          (p.q.dtype() == DType::kBFloat16 && p.k.dtype() == DType::kFloat8E4M3FN &&
           active_capability() == Capability::kAVX512 && bf16_dot_available()));
}

FlashScratch::FlashScratch(const AttentionParams& params, bool bf16_dot)
    : head_dim_vo_padded(round_up(std::max<int64_t>(params.head_dim_vo, 1), kMaxLanes)),
      bf16_dot(bf16_dot),
      head_dim_qk_pairs2(round_up(params.head_dim_qk, 2)),
      flex(params.mask, kBlockKv),
      amx(bf16_dot) {
  const int64_t head_dim_qk = params.head_dim_qk, head_dim_vo = params.head_dim_vo;
  // The bf16 buffers hold two elements per float slot.
  const int64_t sizes[] = {kBlockQ * head_dim_qk,
                           kBlockQ * kBlockKv,
                           kBlockQ * head_dim_vo_padded,
                           kBlockQ,
                           kBlockQ,
                           std::max(head_dim_qk, head_dim_vo),
                           bf16_dot ? kBlockQ * head_dim_qk_pairs2 / 2 : 0,
                           bf16_dot ? kBlockQ * kBlockKv / 2 : 0,
                           kBlockQ * 16,
                           kBlockQ * head_dim_vo_padded,
                           kBlockQ,
                           kBlockQ,
                           bf16_dot ? kBlockQ * kPvGroup * kBlockKv / 2 : 0};
  int64_t floats = 0;
  for (int64_t s : sizes) floats += round_up(s, kMaxLanes);
  buffer_ = Tensor::empty({floats}, DType::kFloat32);
  float* next = buffer_.data<float>();
  float* slots[std::size(sizes)];
  for (size_t i = 0; i < std::size(sizes); ++i) {
    slots[i] = next;
    next += round_up(sizes[i], kMaxLanes);
  }
  q = slots[0];
  scores = slots[1];
  row = slots[5];
  q_bf16 = reinterpret_cast<uint16_t*>(slots[6]);
  p_bf16 = reinterpret_cast<uint16_t*>(slots[7]);
  p_group = reinterpret_cast<uint16_t*>(slots[12]);
  // Both levels share the running max and the factors of its updates.
  total = {slots[3], slots[4], slots[11], slots[2], head_dim_vo_padded, nullptr};
  partial = {total.m, slots[10], total.alpha, slots[9], head_dim_vo_padded, slots[8]};
}

FlashScratch::~FlashScratch() = default;

detail::Work forward_work(const AttentionParams& p) {
  // S = Q K^T and O = P V: 2 L S (E + Ev) per query head.
  const double flops = 2.0 * static_cast<double>(p.batch * p.num_heads_q) *
                       static_cast<double>(p.q_len) * static_cast<double>(p.kv_len) *
                       static_cast<double>(p.head_dim_qk + p.head_dim_vo);
  // k and v, read once per kv head (in the decode path, straight from memory).
  const double kv_bytes = static_cast<double>(p.batch * p.num_heads_kv) *
                          static_cast<double>(p.kv_len) *
                          static_cast<double>(p.head_dim_qk + p.head_dim_vo) *
                          static_cast<double>(element_size(p.k.dtype()));
  return {flops, kv_bytes};
}

void flash_forward(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  if (p.dtype == DType::kFloat64) return flash_forward_f64(p, out, lse);
  if (use_decode_path(p)) return flash_decode(p, out, lse);
  const FlashQBlockFn q_block = flash_q_block_for(active_capability());
  const int64_t q_blocks = (p.q_len + kBlockQ - 1) / kBlockQ;
  const int64_t group_items = p.group_size() * q_blocks;
  if (p.batch * p.num_heads_q * q_blocks == 0) return;
  const bool bf16_dot = uses_bf16_dot(p);
  PackedKv kv(p, bf16_dot);
  flex::PartialBlockBits partial_bits(p.mask.block_mask.get());
  const ForwardCall call{p, kv, out, lse.data<float>(), static_cast<float>(p.scale)};
  const int64_t generations = p.batch * p.num_heads_kv;
  // Items done per (batch, kv head): a thread starts a (b, kv head) only once the one
  // PackedKv::kSlots before it is done, whose slot it reuses.
  std::vector<std::atomic<int64_t>> done(static_cast<size_t>(generations));
  const int64_t items = generations * group_items;
  const int threads = detail::ThreadingContext::current().threads_for(items, forward_work(p));
  detail::ParallelErrors errors;
  // One loop over the q-blocks of every query head of every (batch, kv head): the threads
  // share a group's q-blocks, packing its k/v tiles on first use, and move on to the next
  // group without waiting for each other. Dynamic scheduling balances causal masks, whose
  // later q-blocks see more keys; monotonic, so every item of a group is taken before any
  // of a later one and the wait for the slot always ends (on one thread, trivially).
  detail::run_region(threads, [&] {
    std::optional<FlashScratch> scratch;
    errors.guard([&] {
      scratch.emplace(p, bf16_dot);
      scratch->flex.partial_bits = &partial_bits;
    });
#pragma omp for schedule(monotonic : dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t bhk = item / group_items, in_group = item % group_items;
      if (bhk >= PackedKv::kSlots) {
        const std::atomic<int64_t>& previous = done[static_cast<size_t>(bhk - PackedKv::kSlots)];
        while (previous.load(std::memory_order_acquire) != group_items) std::this_thread::yield();
      }
      if (scratch) {
        errors.guard([&] {
          const int64_t b = bhk / p.num_heads_kv, hk = bhk % p.num_heads_kv;
          const int64_t h = hk * p.group_size() + in_group / q_blocks;
          const int64_t q_begin = (in_group % q_blocks) * kBlockQ;
          q_block(call, {b, h, q_begin, std::min(kBlockQ, p.q_len - q_begin)}, *scratch);
        });
      }
      done[static_cast<size_t>(bhk)].fetch_add(1, std::memory_order_release);
    }
  });
  errors.rethrow();
}

}  // namespace sdpa::cpu
