// Split-KV decode path: scratch, work split and the logsumexp merge. The SIMD work is in
// flash_decode_tile.cc.

#include "cpu/flash_decode.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "core/threading.h"
#include "cpu/kernels.h"
#include "cpu/nan_max.h"
#include "cpu/rows.h"

namespace sdpa::cpu {
namespace {

// FLASH takes float32, bfloat16 and float16 (check_flash_cpu_dtype).
bool in_place(const Tensor& rows) { return rows.stride(3) == 1; }

KvRows kv_rows_of(DType dtype) {
  if (dtype == DType::kBFloat16) return KvRows::kBFloat16;
  return dtype == DType::kFloat16 ? KvRows::kFloat16 : KvRows::kFloat32;
}

}  // namespace

bool use_decode_path(const AttentionParams& p) {
  return !p.backward && p.group_size() * p.q_len <= kDecodeMaxRows;
}

DecodeScratch::DecodeScratch(const AttentionParams& params, bool bf16_dot)
    : head_dim_qk_padded(round_up(params.head_dim_qk, kDecodeRowPad)),
      head_dim_vo_padded(round_up(std::max<int64_t>(params.head_dim_vo, 1), kDecodeRowPad)),
      key_rows_in_place(in_place(params.k)),
      value_rows_in_place(in_place(params.v)),
      kv_rows(kv_rows_of(params.k.dtype())),
      flex(params.mask, kBlockKv) {
  bf16_keys = bf16_dot && key_rows_in_place;
  bf16_values = bf16_keys && value_rows_in_place;
  // The bf16 slots hold two elements per float.
  const int64_t sizes[] = {kDecodeMaxRows * head_dim_qk_padded, kDecodeMaxRows * kBlockKv,
                           kBlockKv * std::max(head_dim_qk_padded, head_dim_vo_padded),
                           bf16_keys ? kDecodeMaxRows * head_dim_qk_padded / 2 : 0,
                           bf16_values ? kDecodeMaxRows * kBlockKv / 2 : 0};
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  buffer_ = Tensor::empty({total}, DType::kFloat32);
  float* next = buffer_.data<float>();
  float *q_bf16_slot = nullptr, *p_bf16_slot = nullptr;
  float** slots[] = {&q, &scores, &tile, &q_bf16_slot, &p_bf16_slot};
  for (size_t i = 0; i < std::size(slots); ++i) {
    *slots[i] = next;
    next += sizes[i];
  }
  q_bf16 = reinterpret_cast<uint16_t*>(q_bf16_slot);
  p_bf16 = reinterpret_cast<uint16_t*>(p_bf16_slot);
}

int64_t decode_chunk_len(const AttentionParams& p) {
  const int64_t groups = p.batch * p.num_heads_kv;
  int64_t len = kDecodeChunk;
  while (len < kDecodeMaxChunk &&
         groups * ((p.kv_len + 2 * len - 1) / (2 * len)) >= kDecodeMinItems) {
    len *= 2;
  }
  return len;
}

namespace {

// Merges the chunks of every row in chunk order (out = sum_c e^(m_c - m) acc_c / l,
// l = sum_c e^(m_c - m) l_c): fixed order, so any thread count gives the same bits.
// `base` holds per (group, chunk) item acc [rows, Ev_pad], then max [rows] and sum [rows].
void merge_chunks(const AttentionParams& p, const detail::ThreadingContext& context,
                  const float* base, int64_t chunks, const Tensor& out, const Tensor& lse) {
  const int64_t L = p.q_len, G = p.group_size(), rows = G * L;
  const int64_t groups = p.batch * p.num_heads_kv;
  const int64_t ev_pad = round_up(std::max<int64_t>(p.head_dim_vo, 1), kDecodeRowPad);
  const int64_t item_floats = rows * (ev_pad + 2);
  float* lse_data = lse.data<float>();
  // Memory-bound: every partial is read once.
  const double bytes = 4.0 * static_cast<double>(groups * chunks * item_floats);
  detail::run_region(context.threads_for(groups, {0, bytes}), [&] {
#pragma omp for schedule(static)
    for (int64_t group = 0; group < groups; ++group) {
      const int64_t b = group / p.num_heads_kv, hk = group % p.num_heads_kv;
      std::vector<float> row(static_cast<size_t>(ev_pad));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t h = hk * G + r / L, i = r % L;
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < chunks; ++c) {
          const float* item = base + (group * chunks + c) * item_floats;
          // A chunk with a NaN score has a NaN sum (its max may be -inf when every score
          // is NaN): it makes the row's max, and so the row, NaN.
          const float chunk_sum = item[rows * ev_pad + rows + r];
          if (!(chunk_sum <= 0.0f)) {
            max = max_keeping_nan(max, std::isnan(chunk_sum) ? chunk_sum : item[rows * ev_pad + r]);
          }
        }
        std::fill(row.begin(), row.end(), 0.0f);
        float sum = 0.0f;
        for (int64_t c = 0; c < chunks && max != -std::numeric_limits<float>::infinity(); ++c) {
          const float* item = base + (group * chunks + c) * item_floats;
          const float chunk_sum = item[rows * ev_pad + rows + r];
          if (chunk_sum <= 0.0f) continue;  // NaN sums go on
          const float w = std::exp(item[rows * ev_pad + r] - max);
          sum += w * chunk_sum;
          const float* acc = item + r * ev_pad;
          for (int64_t e = 0; e < ev_pad; ++e) row[static_cast<size_t>(e)] += w * acc[e];
        }
        float* lse_row = lse_data + (b * p.num_heads_q + h) * L + i;
        if (!(sum <= 0.0f)) {  // positive or NaN
          for (float& x : row) x /= sum;
          *lse_row = max + std::log(sum);
        } else {  // fully masked row
          *lse_row = -std::numeric_limits<float>::infinity();
        }
        RowView(out, b, h).store(i, row.data());
      }
    }
  });
}

}  // namespace

void flash_decode(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const int64_t L = p.q_len, G = p.group_size(), rows = G * L;
  const int64_t groups = p.batch * p.num_heads_kv;
  const int64_t chunk_len = decode_chunk_len(p);
  const int64_t chunks = (p.kv_len + chunk_len - 1) / chunk_len;
  const int64_t ev_pad = round_up(std::max<int64_t>(p.head_dim_vo, 1), kDecodeRowPad);
  if (groups * rows == 0) return;
  const DecodeChunkFn chunk_fn = decode_chunk_for(active_capability());
  const bool bf16_dot = uses_bf16_dot(p);

  // Per (group, chunk) item: acc [rows, Ev_pad], then max [rows] and sum [rows].
  const int64_t item_floats = rows * (ev_pad + 2);
  const Tensor partials =
      Tensor::empty({std::max<int64_t>(groups * chunks * item_floats, 1)}, DType::kFloat32);
  float* const base = partials.data<float>();
  detail::ParallelErrors errors;
  const int64_t items = groups * chunks;
  const detail::ThreadingContext context = detail::ThreadingContext::current();
  detail::run_region(context.threads_for(items, forward_work(p)), [&] {
    DecodeScratch scratch(p, bf16_dot);
    // Guided: items go out in runs of consecutive chunks of one kv head, shrinking towards
    // the end: a thread reads K and V on across chunk boundaries, its requests running
    // ahead into the next chunk, and the last small runs even out uneven items (masked
    // chunks) and busy neighbours (one item at a time read 0-10% slower from memory and
    // 4% slower from cache).
#pragma omp for schedule(guided)
    for (int64_t item = 0; item < items; ++item) {
      try {
        const int64_t group = item / chunks, chunk = item % chunks;
        float* acc = base + item * item_floats;
        chunk_fn(p, group / p.num_heads_kv, group % p.num_heads_kv, chunk * chunk_len,
                 std::min(p.kv_len, (chunk + 1) * chunk_len), scratch, acc, acc + rows * ev_pad,
                 acc + rows * ev_pad + rows);
      } catch (...) {
        errors.capture();
      }
    }
  });
  errors.rethrow();

  merge_chunks(p, context, base, chunks, out, lse);
}

}  // namespace sdpa::cpu
