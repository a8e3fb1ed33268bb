// Split-KV decode path: scratch, work split and the logsumexp merge. The SIMD work is in
// flash_decode_tile.cc.

#include "cpu/flash_decode.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <vector>

#include "core/parallel.h"
#include "core/threading.h"
#include "cpu/kernels.h"
#include "cpu/kernel_context.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"

namespace sdpa::cpu {
namespace {

// The decode path takes float32, bfloat16 and float16, and float8_e4m3fn caches (float64
// runs flash_f64.h).
bool in_place(const Tensor& rows) { return rows.stride(3) == 1; }

KvRows kv_rows_of(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return KvRows::kBFloat16;
    case DType::kFloat16: return KvRows::kFloat16;
    case DType::kFloat8E4M3FN: return KvRows::kFloat8E4M3FN;
    default: return KvRows::kFloat32;
  }
}

}  // namespace

bool use_decode_path(const AttentionParams& p) {
  return !p.backward && p.group_size() * p.q_len <= kDecodeMaxRows;
}

int64_t kv_heads_per_item(const AttentionParams& p) {
  // Heads side by side: head h's row r starts E elements after head h - 1's.
  const auto side_by_side = [](const Tensor& rows) {
    return rows.size(3) > 0 && rows.stride(3) == 1 && rows.stride(1) == rows.size(3);
  };
  if (p.num_heads_kv < 2 || !side_by_side(p.k) || !side_by_side(p.v)) return 1;
  const auto stage_bytes = [](const Tensor& rows) {
    return std::max<int64_t>(static_cast<int64_t>(element_size(rows.dtype())), 2);
  };
  const int64_t per_head =
      kBlockKv * (p.head_dim_qk * stage_bytes(p.k) + p.head_dim_vo * stage_bytes(p.v));
  const int64_t most = std::min(kDecodeStageBytes / per_head, kDecodeMaxItemHeads);
  if (most < 2) return 1;
  const int64_t blocks = (p.num_heads_kv + most - 1) / most;
  return (p.num_heads_kv + blocks - 1) / blocks;
}

DecodeScratch::DecodeScratch(const AttentionParams& params, bool bf16_dot)
    : heads(kv_heads_per_item(params)),
      head_dim_qk_padded(round_up(params.head_dim_qk, kDecodeRowPad)),
      head_dim_vo_padded(round_up(std::max<int64_t>(params.head_dim_vo, 1), kDecodeRowPad)),
      key_rows_in_place(in_place(params.k)),
      value_rows_in_place(in_place(params.v)),
      kv_rows(kv_rows_of(params.k.dtype())),
      flex(params.mask, kBlockKv) {
  // vdpbf16ps reads keys in runs of 16 rows one stride apart, which must not cross a page
  // (values are read by address: Bf16Values); a staged tile is one run.
  const bool page_runs = !params.kv_pages || params.kv_pages->page_size % 16 == 0;
  bf16_keys = bf16_dot && key_rows_in_place && (page_runs || heads > 1);
  bf16_values = bf16_keys && value_rows_in_place;
  stage_widens = heads > 1 && bf16_values && kv_rows == KvRows::kFloat8E4M3FN;
  stage_tiles = heads > 1 && !(bf16_values && page_runs && kv_rows == KvRows::kBFloat16);
  // The bf16 slots hold two elements per float; the stage's rows are whole cache lines.
  const auto stage_floats = [&](const Tensor& rows, int64_t cols) {
    const int64_t bytes =
        kBlockKv * heads * cols * static_cast<int64_t>(element_size(stage_dtype(rows.dtype())));
    return stage_tiles ? round_up(bytes, 64) / 4 : 0;
  };
  const int64_t sizes[] = {heads * kDecodeMaxRows * head_dim_qk_padded,
                           kDecodeMaxRows * kBlockKv,
                           kBlockKv * std::max(head_dim_qk_padded, head_dim_vo_padded),
                           bf16_keys ? heads * kDecodeMaxRows * head_dim_qk_padded / 2 : 0,
                           bf16_values ? kDecodeMaxRows * kBlockKv / 2 : 0,
                           stage_floats(params.k, params.head_dim_qk),
                           stage_floats(params.v, params.head_dim_vo)};
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  buffer_ = Tensor::empty({total}, DType::kFloat32);
  float* next = buffer_.data<float>();
  float *q_bf16_slot = nullptr, *p_bf16_slot = nullptr, *stage_k_slot = nullptr,
        *stage_v_slot = nullptr;
  float** slots[] = {&q, &scores, &tile, &q_bf16_slot, &p_bf16_slot, &stage_k_slot, &stage_v_slot};
  for (size_t i = 0; i < std::size(slots); ++i) {
    *slots[i] = next;
    next += sizes[i];
  }
  q_bf16 = reinterpret_cast<uint16_t*>(q_bf16_slot);
  p_bf16 = reinterpret_cast<uint16_t*>(p_bf16_slot);
  stage_k = stage_k_slot;
  stage_v = stage_v_slot;
}

int64_t decode_chunk_len(const AttentionParams& p) {
  const int64_t heads = kv_heads_per_item(p);
  const int64_t groups = p.batch * ((p.num_heads_kv + heads - 1) / heads);
  int64_t len = kDecodeChunk;
  while (len < kDecodeMaxChunk &&
         groups * ((p.kv_len + 2 * len - 1) / (2 * len)) >= kDecodeMinItems) {
    len *= 2;
  }
  return len;
}

namespace {

// The partial states of the (group, chunk) items in one buffer: per item o [rows, Ev_pad],
// then m [rows] and l [rows].
struct ChunkPartials {
  float* base;
  int64_t chunks, rows, ev_pad;

  int64_t item_floats() const { return rows * (ev_pad + 2); }
  SoftmaxRows item(int64_t group, int64_t chunk) const {
    float* o = base + (group * chunks + chunk) * item_floats();
    return {o + rows * ev_pad, o + rows * ev_pad + rows, nullptr, o, ev_pad};
  }
};

// Merges the chunks of every row in chunk order (PartialMerge): fixed order, so any
// thread count gives the same bits.
void merge_chunks(const AttentionParams& p, const detail::ThreadingContext& context,
                  const ChunkPartials& partials, const Tensor& out, const Tensor& lse) {
  const int64_t L = p.q_len, G = p.group_size(), rows = partials.rows;
  const int64_t groups = p.batch * p.num_heads_kv, chunks = partials.chunks;
  const int64_t ev_pad = partials.ev_pad;
  float* lse_data = lse.data<float>();
  // Memory-bound: every partial is read once.
  const double bytes = 4.0 * static_cast<double>(groups * chunks * partials.item_floats());
  detail::ParallelErrors errors;
  detail::run_region(context.threads_for(groups, {0, bytes}), [&] {
    std::vector<float> row;
    errors.guard([&] { row.resize(static_cast<size_t>(ev_pad)); });
#pragma omp for schedule(static)
    for (int64_t group = 0; group < groups; ++group) {
      if (row.empty()) continue;  // ev_pad >= kDecodeRowPad: the thread's row failed
      const int64_t b = group / p.num_heads_kv, hk = group % p.num_heads_kv;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = hk * G + r / L, i = r % L;
        PartialMerge<float> merge;
        for (int64_t c = 0; c < chunks; ++c) {
          const SoftmaxRows item = partials.item(group, c);
          merge.see(item.m[r], item.l[r]);
        }
        std::fill(row.begin(), row.end(), 0.0f);
        float l = 0.0f;
        for (int64_t c = 0; c < chunks && !merge.empty(); ++c) {
          const SoftmaxRows item = partials.item(group, c);
          if (!contributes(item.l[r])) continue;
          const float w = merge.weight(item.m[r]);
          l += w * item.l[r];
          const float* o = item.o + r * ev_pad;
          for (int64_t e = 0; e < ev_pad; ++e) row[static_cast<size_t>(e)] += w * o[e];
        }
        const RowFinish<float> end = finalize(merge.max(), l);
        for (float& x : row) x = end.masked ? 0.0f : x * end.inv_l;
        lse_data[query_row_index(p, b, h, i)] = end.lse;
        RowView(out, b, h).store(i, row.data());
      }
    }
  });
  errors.rethrow();
}

}  // namespace

void flash_decode(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const int64_t L = p.q_len, G = p.group_size(), rows = G * L;
  const int64_t groups = p.batch * p.num_heads_kv;
  const int64_t heads = kv_heads_per_item(p);
  const int64_t head_blocks = (p.num_heads_kv + heads - 1) / heads;
  const int64_t chunk_len = decode_chunk_len(p);
  const int64_t chunks = (p.kv_len + chunk_len - 1) / chunk_len;
  const int64_t ev_pad = round_up(std::max<int64_t>(p.head_dim_vo, 1), kDecodeRowPad);
  if (groups * rows == 0) return;
  const DecodeChunkFn chunk_fn = decode_chunk_for(active_capability());
  const bool bf16_dot = decode_uses_bf16_dot(p);

  ChunkPartials partials{nullptr, chunks, rows, ev_pad};
  const Tensor buffer = Tensor::empty(
      {std::max<int64_t>(groups * chunks * partials.item_floats(), 1)}, DType::kFloat32);
  partials.base = buffer.data<float>();
  detail::ParallelErrors errors;
  const int64_t items = p.batch * head_blocks * chunks;
  const detail::ThreadingContext context = detail::ThreadingContext::current();
  detail::run_region(context.threads_for(items, forward_work(p)), [&] {
    std::optional<DecodeScratch> scratch;
    errors.guard([&] { scratch.emplace(p, bf16_dot); });
    // Guided: items go out in runs of consecutive chunks of one kv head, shrinking towards
    // the end: a thread reads K and V on across chunk boundaries, its requests running
    // ahead into the next chunk, and the last small runs even out uneven items (masked
    // chunks) and busy neighbours (one item at a time read 0-10% slower from memory and
    // 4% slower from cache).
#pragma omp for schedule(guided)
    for (int64_t item = 0; item < items; ++item) {
      if (!scratch) continue;
      errors.guard([&] {
        const int64_t block = item / chunks, chunk = item % chunks;
        const int64_t b = block / head_blocks, hk = block % head_blocks * heads;
        const DecodeItem work{b, hk, chunk * chunk_len, std::min(p.kv_len, (chunk + 1) * chunk_len),
                              std::min(heads, p.num_heads_kv - hk)};
        SoftmaxRows out[kDecodeMaxItemHeads];
        for (int64_t h = 0; h < work.heads; ++h) {
          out[h] = partials.item(b * p.num_heads_kv + hk + h, chunk);
        }
        chunk_fn(p, work, *scratch, out);
      });
    }
  });
  errors.rethrow();

  merge_chunks(p, context, partials, out, lse);
}

}  // namespace sdpa::cpu
