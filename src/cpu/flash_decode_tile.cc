// Per-target body of the split-KV decode path (flash_decode.h): every query row of a kv
// head's GQA group over one chunk of keys, tile by tile: scores as dot products of key
// rows, summed lanewise by one reduction tree per vector of keys; the online softmax of
// FlashAttention-2; P.v into register-held output rows. Key and value rows of unit stride
// are read in place: bf16 by vdpbf16ps where available, else loaded (widened) in
// registers (decode_rows-inl.h). Other rows are converted into a float32 tile first.
// Compiled for AVX-512, AVX2 and the portable baseline by Highway's foreach_target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_decode_tile.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>

#include "cpu/bf16_decode.h"
#include "cpu/bf16_dot.h"
#include "cpu/decode_rows-inl.h"
#include "cpu/flash_decode.h"
#include "cpu/gemm-inl.h"
#include "cpu/philox.h"
#include "cpu/reduce_lanes-inl.h"
#include "cpu/softmax_bf16-inl.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace {

// dst[0, padded) = row r of `rows` as float32 (times `multiplier`), zero beyond cols():
// q rows, and key / value rows not read in place (other strides, the scalar target).
HWY_INLINE void LoadRow(const RowView& rows, int64_t r, int64_t padded, float* HWY_RESTRICT dst,
                        float multiplier = 1.0f) {
  rows.load(r, dst, multiplier);
  std::fill(dst + rows.cols(), dst + padded, 0.0f);
}

// Rows are read once, one after another, each a few hundred bytes: requesting the row
// kPrefetchRows ahead keeps enough misses in flight to stream at memory bandwidth. The
// requests go to L2 (prefetcht1): as L1 prefetches they held the L1 miss buffers the
// demand loads need (one thread streamed 8.8 GB/s that way, 10.9 GB/s into L2).
constexpr int64_t kPrefetchRows = 32;

HWY_INLINE void Prefetch(const RowView& rows, int64_t r) {
  const char* row = static_cast<const char*>(rows.row_data(r));
  const int64_t bytes = rows.cols() * rows.col_stride() * rows.element_bytes();
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset, 0, 2);
}

// The rows of the tile after the one at j0, for the P.v passes to request. Past the chunk's
// end too: the next chunk is usually this thread's next item (flash_decode.cpp).
HWY_INLINE RowsAhead NextTileRows(const RowView& rows, int64_t j0, int64_t S) {
  const int64_t next = j0 + kBlockKv;
  return {next < S ? rows.row_data(next) : nullptr, std::clamp<int64_t>(S - next, 0, kBlockKv),
          rows.element_bytes()};
}

#if HWY_TARGET != HWY_SCALAR
// f(std::integral_constant<KvRows, kind>()): the in-place kernels compiled per row type.
template <class F>
HWY_INLINE void ForKvRows(KvRows kind, const F& f) {
  switch (kind) {
    case KvRows::kBFloat16: return f(std::integral_constant<KvRows, KvRows::kBFloat16>());
    case KvRows::kFloat16: return f(std::integral_constant<KvRows, KvRows::kFloat16>());
    case KvRows::kFloat32: return f(std::integral_constant<KvRows, KvRows::kFloat32>());
  }
}

// Scores of keys [key0, key0 + Lanes) read in place into scores[0, Lanes) (keys past
// kv_len repeat the last key: the caller masks their scores). Requests the key rows
// kPrefetchRows ahead, and the value rows of `values` (null: none) while they belong to
// the chunk's first tile (the P.v pass of the tile before requests the others).
template <KvRows kRows>
HWY_INLINE void ScoreKeyGroupInPlace(const float* HWY_RESTRICT q, int64_t rows, int64_t q_stride,
                                     const RowView& k_rows, const RowView* values,
                                     int64_t first_tile_end, int64_t key0, int64_t S,
                                     float* HWY_RESTRICT scores) {
  using T = KvElement<kRows>;
  constexpr int64_t kBlock = SplitBlock(), lanes = kBlock / 2;
  const int64_t E = k_rows.cols(), full = E / kBlock * kBlock;
  const T* keys[lanes];
  HWY_ALIGN T tails[lanes * kBlock];
  for (int64_t k = 0; k < lanes; ++k) {
    const int64_t key = std::min(key0 + k, S - 1);
    const int64_t ahead = std::min(key + kPrefetchRows, S - 1);
    Prefetch(k_rows, ahead);
    if (values && ahead < first_tile_end) Prefetch(*values, ahead);
    keys[k] = static_cast<const T*>(k_rows.row_data(key));
  }
  if (full < E) GatherTails(keys, lanes, full, E, tails);
  ScoreKeysInPlace<kRows>(q, rows, q_stride, keys, full, full < E ? tails : nullptr, scores,
                          kBlockKv);
}

// acc (rows in kRows' layout) += P[:, 0, n) . value rows [first, first + n) read in place;
// requests the rows of the tile after the one at j0 on the way.
template <KvRows kRows>
HWY_INLINE void AccumulateTileInPlace(const float* HWY_RESTRICT p, int64_t rows,
                                      const RowView& v_rows, int64_t first, int64_t n, int64_t j0,
                                      int64_t S, float* HWY_RESTRICT acc, int64_t acc_stride) {
  using T = KvElement<kRows>;
  constexpr int64_t kBlock = SplitBlock();
  const int64_t Ev = v_rows.cols(), full = Ev / kBlock * kBlock;
  const T* values[kBlockKv];
  HWY_ALIGN T tails[kBlockKv * kBlock];
  for (int64_t k = 0; k < n; ++k) values[k] = static_cast<const T*>(v_rows.row_data(first + k));
  if (full < Ev) GatherTails(values, n, full, Ev, tails);
  AccumulateValuesInPlace<kRows>(p, rows, kBlockKv, values, n, full, full < Ev ? tails : nullptr,
                                 acc, acc_stride, Ev, NextTileRows(v_rows, j0, S),
                                 v_rows.row_stride());
}
#endif  // HWY_TARGET != HWY_SCALAR

// scores[r * kBlockKv + c] = q_r . key_c for rows r < rows and keys c in [c0, c1) (multiples
// of the lane count), key_c being row c of `keys` (row length e_pad).
HWY_INLINE void ScoreKeys(const float* HWY_RESTRICT q, int64_t rows, const float* HWY_RESTRICT keys,
                          int64_t e_pad, int64_t c0, int64_t c1, float* HWY_RESTRICT scores) {
  const hn::ScalableTag<float> d;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(d));
  for (int64_t c = c0; c < c1; c += N) {
    const float* key = keys + c * e_pad;
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * e_pad;
      hn::Vec<decltype(d)> acc[N];
      for (int64_t k = 0; k < N; ++k) acc[k] = hn::Zero(d);
      for (int64_t e = 0; e < e_pad; e += N) {
        const auto qv = hn::LoadU(d, qr + e);
        for (int64_t k = 0; k < N; ++k) {
          acc[k] = hn::MulAdd(qv, hn::LoadU(d, key + k * e_pad + e), acc[k]);
        }
      }
      hn::StoreU(ReduceLanesTree(d, acc, AddLanes()), d, scores + r * kBlockKv + c);
    }
  }
}

}  // namespace

void DecodeChunk(const AttentionParams& p, int64_t b, int64_t hk, int64_t kv_begin, int64_t kv_end,
                 DecodeScratch& ws, float* acc, float* row_max, float* row_sum) {
  const int64_t L = p.q_len, S = p.kv_len, G = p.group_size(), rows = G * L;
  const int64_t e_pad = ws.head_dim_qk_padded, ev_pad = ws.head_dim_vo_padded;
  const float scale = static_cast<float>(p.scale);
  const RowView k_rows(p.k, b, hk), v_rows(p.v, b, hk);

  ColumnRange visible{kv_end, kv_begin};  // union of the rows' keys within the chunk
#if HWY_TARGET == HWY_AVX3
  const bool bf16_keys = ws.bf16_keys, bf16_values = ws.bf16_values;
#else
  const bool bf16_keys = false, bf16_values = false;  // they hold only at the AVX512 level
#endif
  const bool p_in_bf16 = bf16_values && !p.has_dropout();
#if HWY_TARGET != HWY_SCALAR
  const bool keys_in_place = !bf16_keys && ws.key_rows_in_place;
  const bool values_in_place = !bf16_values && ws.value_rows_in_place;
  constexpr int64_t kSplit = SplitBlock();
#else
  const bool keys_in_place = false, values_in_place = false;
#endif
  // bf16 rows widened in registers need q and the accumulators in split layout.
  const bool bf16_rows = ws.kv_rows == KvRows::kBFloat16;
  [[maybe_unused]] const bool split_keys = keys_in_place && bf16_rows;
  [[maybe_unused]] const bool split_values = values_in_place && bf16_rows;
  const int64_t E = p.head_dim_qk;
  [[maybe_unused]] const int64_t Ev = p.head_dim_vo;  // read by some targets' paths only
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = hk * G + r / L, i = r % L;
    if (bf16_keys) {
      // q as bf16 bits, unscaled (scale multiplies the float32 scores).
      const RowView q_rows(p.q, b, h);
      const uint16_t* src = static_cast<const uint16_t*>(q_rows.row_data(i));
      uint16_t* dst = ws.q_bf16 + r * e_pad;
      for (int64_t e = 0; e < E; ++e) dst[e] = src[e * q_rows.col_stride()];
      std::fill(dst + E, dst + e_pad, uint16_t{0});
    } else {
      LoadRow(RowView(p.q, b, h), i, e_pad, ws.q + r * e_pad, scale);
#if HWY_TARGET != HWY_SCALAR
      if (split_keys) SplitRow(ws.q + r * e_pad, round_up(E, kSplit));
#endif
    }
    ws.row_keys[r] = row_columns(p.mask, b, i, L, S);
    const ColumnRange& keys = ws.row_keys[r];
    if (std::max(keys.begin, kv_begin) < std::min(keys.end, kv_end)) {
      visible.begin = std::min(visible.begin, std::max(keys.begin, kv_begin));
      visible.end = std::max(visible.end, std::min(keys.end, kv_end));
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
  const int64_t first_tile_end = visible.begin / kBlockKv * kBlockKv + kBlockKv;
  for (int64_t j0 = first_tile_end - kBlockKv; j0 < visible.end; j0 += kBlockKv) {
    const int64_t cols = std::min(kBlockKv, S - j0);
    const int64_t c_begin = std::max<int64_t>(visible.begin - j0, 0);
    const int64_t c_end = std::min(cols, visible.end - j0);
    // Scores in whole vectors of keys: [g_begin, g_end) covers [c_begin, c_end) within the
    // tile; keys past kv_len score 0 (masked below).
    const int64_t g_begin = c_begin / lanes * lanes;
    const int64_t g_end = (c_end + lanes - 1) / lanes * lanes;
    if (bf16_keys) {
#if HWY_TARGET == HWY_AVX3
      // 16 keys at a time, each group requesting the rows kPrefetchRows ahead of it (a
      // whole tile's requests at once overflow the miss queues and are dropped). Value
      // rows are requested by the P.v pass of the tile before theirs, except the first
      // tile's, requested here with the keys.
      for (int64_t c = g_begin; c < g_end; c += 16) {
        for (int64_t k = c; k < c + 16; ++k) {
          const int64_t ahead = std::min(j0 + k + kPrefetchRows, S - 1);
          Prefetch(k_rows, ahead);
          if (bf16_values && ahead < first_tile_end) Prefetch(v_rows, ahead);
        }
        Bf16ScoreKeys(ws.q_bf16, rows, e_pad, static_cast<const uint16_t*>(k_rows.row_data(j0 + c)),
                      k_rows.row_stride(), E, S - j0 - c, 16, scale, ws.scores + c, kBlockKv);
      }
#endif
    } else if (keys_in_place) {
#if HWY_TARGET != HWY_SCALAR
      const RowView* values = values_in_place ? &v_rows : nullptr;
      ForKvRows(ws.kv_rows, [&](auto kind) HWY_ATTR {
        for (int64_t c = g_begin; c < g_end; c += lanes) {
          ScoreKeyGroupInPlace<decltype(kind)::value>(ws.q, rows, e_pad, k_rows, values,
                                                      first_tile_end, j0 + c, S, ws.scores + c);
        }
      });
#endif
    } else {
      for (int64_t c = g_begin; c < g_end; ++c) {
        float* key = ws.tile + c * e_pad;
        if (j0 + c >= S) {
          std::fill(key, key + e_pad, 0.0f);
          continue;
        }
        Prefetch(k_rows, std::min(j0 + c + kPrefetchRows, S - 1));
        LoadRow(k_rows, j0 + c, e_pad, key);
      }
      ScoreKeys(ws.q, rows, ws.tile, e_pad, g_begin, g_end, ws.scores);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = hk * G + r / L, i = r % L;
      // Columns outside [c_begin, c_end) are outside every row's keys: MaskScoreRow sets
      // them (and every other masked key) to -inf.
      MaskScoreRow(p, DenseMaskRows(p.mask, b, h), &ws.flex, b, h, i, ws.row_keys[r], j0, cols,
                   ws.scores + r * kBlockKv);
    }
    // P goes to bf16 as the softmax computes it, except where dropout needs float32 P.
    if (p_in_bf16) {
#if HWY_TARGET == HWY_AVX3
      SoftmaxTileToBf16(ws.scores, rows, 1.0f, max_rows, sum_rows, alpha, ws.p_bf16);
#endif
    } else {
      SoftmaxTile(ws.scores, rows, nullptr, 1.0f, max_rows, sum_rows, alpha);
    }
    for (int64_t r = 0; r < rows; ++r) {
      // The bf16 P.v rescales its accumulators as it loads them.
      if (alpha[r] != 1.0f && !bf16_values) ScaleRow(acc + r * ev_pad, ev_pad, alpha[r]);
      if (p.has_dropout()) {
        const int64_t h = hk * G + r / L, i = r % L;
        const int64_t element = ((b * p.num_heads_q + h) * L + i) * S + j0;
        DropoutStream(p.dropout.philox, p.dropout.p)
            .apply(static_cast<uint64_t>(element), ws.scores + r * kBlockKv, cols);
      }
    }
    if (bf16_values) {
#if HWY_TARGET == HWY_AVX3
      // Keys in pairs from an even column; P is 0 at masked columns (and past c_end).
      const int64_t pair_begin = c_begin / 2 * 2;
      for (int64_t r = 0; r < rows && !p_in_bf16; ++r) {
        ConvertRowToBf16(ws.scores + r * kBlockKv, ws.p_bf16 + r * kBlockKv, kBlockKv);
      }
      // The P.v pass requests the next tile's value rows while it reads these: memory
      // then streams values during P.v and keys during the scores, instead of idling
      // through P.v with both requested in bursts during the scores.
      const RowsAhead ahead = NextTileRows(v_rows, j0, S);
      Bf16AccumulateValues(ws.p_bf16 + pair_begin, rows, kBlockKv,
                           static_cast<const uint16_t*>(v_rows.row_data(j0 + pair_begin)),
                           v_rows.row_stride(), Ev, c_end - pair_begin, alpha, acc, ev_pad,
                           ahead);
#endif
    } else if (values_in_place) {
#if HWY_TARGET != HWY_SCALAR
      ForKvRows(ws.kv_rows, [&](auto kind) HWY_ATTR {
        AccumulateTileInPlace<decltype(kind)::value>(ws.scores + c_begin, rows, v_rows,
                                                     j0 + c_begin, c_end - c_begin, j0, S, acc,
                                                     ev_pad);
      });
#endif
    } else {
      for (int64_t c = c_begin; c < c_end; ++c) {
        Prefetch(v_rows, std::min(j0 + c + kPrefetchRows, S - 1));
        LoadRow(v_rows, j0 + c, ev_pad, ws.tile + c * ev_pad);
      }
      // P.v with register-blocked accumulators (the rows' outputs stay in registers over
      // the tile's keys instead of a load and store per key).
      Gemm(rows, ev_pad, c_end - c_begin, ws.scores + c_begin, kBlockKv, ws.tile + c_begin * ev_pad,
           ev_pad, acc, ev_pad, true);
    }
  }
#if HWY_TARGET == HWY_AVX3
  static_assert(kDecodeRowPad % kValueBlock == 0);
  if (bf16_values) {
    for (int64_t r = 0; r < rows; ++r) ValueOrderToElements(acc + r * ev_pad, ev_pad);
  }
#endif
#if HWY_TARGET != HWY_SCALAR
  if (split_values) {
    for (int64_t r = 0; r < rows; ++r) SplitRow(acc + r * ev_pad, round_up(Ev, kSplit), true);
  }
#endif
  std::copy(max_rows, max_rows + rows, row_max);
  std::copy(sum_rows, sum_rows + rows, row_sum);
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
