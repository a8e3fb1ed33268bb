// Per-target body of the split-KV decode path (flash_decode.h): every query row of a kv
// head's GQA group over one chunk of keys, tile by tile: scores as dot products of key
// rows, summed lanewise by one reduction tree per vector of keys; the online softmax of
// FlashAttention-2; P.v into register-held output rows. How key and value rows are read
// is a route chosen once per call (decode_routes-inl.h): rows of unit stride in place,
// bf16 by vdpbf16ps where available (decode_bf16_avx3-inl.h), else loaded (widened) in
// registers (decode_rows-inl.h); other rows are converted into a float32 tile first.
// Compiled for AVX-512, AVX2 and the portable baseline by Highway's foreach_target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_decode_tile.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>

#include "cpu/decode_bf16_avx3-inl.h"
#include "cpu/decode_routes-inl.h"
#include "cpu/flash_decode.h"
#include "cpu/philox.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace {

// DecodeChunk with key rows read by `keys` and value rows by `values` (decode_routes-inl.h).
template <class KeyRoute, class ValueRoute>
void DecodeChunkWith(const KeyRoute& keys, const ValueRoute& values, const AttentionParams& p,
                     int64_t b, int64_t hk, int64_t kv_begin, int64_t kv_end, DecodeScratch& ws,
                     float* acc, float* row_max, float* row_sum) {
  const int64_t L = p.q_len, S = p.kv_len, G = p.group_size(), rows = G * L;
  const int64_t e_pad = ws.head_dim_qk_padded, ev_pad = ws.head_dim_vo_padded;
  const RowView k_rows(p.k, b, hk), v_rows(p.v, b, hk);
  // first_tile_end is set once the chunk's visible keys are known.
  DecodeCall call{k_rows, v_rows, ValueRoute::kInPlace ? &v_rows : nullptr, ws, rows, S, e_pad,
                  ev_pad, 0, static_cast<float>(p.scale), acc};

  ColumnRange visible{kv_end, kv_begin};  // union of the rows' keys within the chunk
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = hk * G + r / L, i = r % L;
    keys.LoadQuery(call, RowView(p.q, b, h), i, r);
    ws.row_keys[r] = row_columns(p.mask, b, i, L, S);
    const ColumnRange& row_keys = ws.row_keys[r];
    if (std::max(row_keys.begin, kv_begin) < std::min(row_keys.end, kv_end)) {
      visible.begin = std::min(visible.begin, std::max(row_keys.begin, kv_begin));
      visible.end = std::max(visible.end, std::min(row_keys.end, kv_end));
    }
  }
  std::fill(acc, acc + rows * ev_pad, 0.0f);
  std::fill(row_max, row_max + rows, kNegInf);
  std::fill(row_sum, row_sum + rows, 0.0f);
  if (visible.empty()) return;
  // The tile loop requests rows kPrefetchRows ahead of those it reads: request the chunk's
  // first rows here, so that its start does not wait for them one demand miss at a time.
  for (int64_t j = visible.begin; j < std::min(visible.begin + kPrefetchRows, visible.end); ++j) {
    Prefetch(k_rows, j);
    Prefetch(v_rows, j);
  }
  // SoftmaxTile's running state, in whole vectors of rows; copied out at the end.
  HWY_ALIGN float max_rows[kDecodeMaxRows], sum_rows[kDecodeMaxRows], alpha[kDecodeMaxRows];
  std::fill(max_rows, max_rows + kDecodeMaxRows, kNegInf);
  std::fill(sum_rows, sum_rows + kDecodeMaxRows, 0.0f);

  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  call.first_tile_end = visible.begin / kBlockKv * kBlockKv + kBlockKv;
  for (int64_t j0 = call.first_tile_end - kBlockKv; j0 < visible.end; j0 += kBlockKv) {
    const int64_t cols = std::min(kBlockKv, S - j0);
    const int64_t c_begin = std::max<int64_t>(visible.begin - j0, 0);
    const int64_t c_end = std::min(cols, visible.end - j0);
    // Scores in whole vectors of keys: [g_begin, g_end) covers [c_begin, c_end) within the
    // tile; keys past kv_len score 0 (masked below).
    const int64_t g_begin = c_begin / lanes * lanes;
    const int64_t g_end = (c_end + lanes - 1) / lanes * lanes;
    keys.ScoreTile(call, j0, g_begin, g_end);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = hk * G + r / L, i = r % L;
      // Columns outside [c_begin, c_end) are outside every row's keys: MaskScoreRow sets
      // them (and every other masked key) to -inf.
      MaskScoreRow(p, DenseMaskRows(p.mask, b, h), &ws.flex, b, h, i, ws.row_keys[r], j0, cols,
                   ws.scores + r * kBlockKv);
    }
    values.Softmax(call, max_rows, sum_rows, alpha);
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (!ValueRoute::kRescalesAcc) {
        if (alpha[r] != 1.0f) ScaleRow(acc + r * ev_pad, ev_pad, alpha[r]);
      }
      if (p.has_dropout()) {
        const int64_t h = hk * G + r / L, i = r % L;
        const int64_t element = ((b * p.num_heads_q + h) * L + i) * S + j0;
        DropoutStream(p.dropout.philox, p.dropout.p)
            .apply(static_cast<uint64_t>(element), ws.scores + r * kBlockKv, cols);
      }
    }
    values.Accumulate(call, j0, c_begin, c_end, alpha);
  }
  values.Finish(call);
  std::copy(max_rows, max_rows + rows, row_max);
  std::copy(sum_rows, sum_rows + rows, row_sum);
}

}  // namespace

void DecodeChunk(const AttentionParams& p, int64_t b, int64_t hk, int64_t kv_begin, int64_t kv_end,
                 DecodeScratch& ws, float* acc, float* row_max, float* row_sum) {
  WithDecodeRoutes(ws, p.has_dropout(), [&](const auto& keys, const auto& values) HWY_ATTR {
    DecodeChunkWith(keys, values, p, b, hk, kv_begin, kv_end, ws, acc, row_max, row_sum);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {

DecodeChunkFn decode_chunk_for(Capability capability) {
  switch (capability) {
#if HWY_TARGETS & HWY_AVX3
    case Capability::kAVX512:
      return &N_AVX3::DecodeChunk;
#endif
#if HWY_TARGETS & HWY_AVX2
    case Capability::kAVX2:
      return &N_AVX2::DecodeChunk;
#endif
    default:
      break;
  }
#if HWY_TARGETS & HWY_EMU128
  return &N_EMU128::DecodeChunk;
#else
  return &N_SCALAR::DecodeChunk;
#endif
}

}  // namespace sdpa::cpu
#endif  // HWY_ONCE
