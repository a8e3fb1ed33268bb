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
#include <cstring>
#include <type_traits>

#include "core/kernel_inline.h"
#include "cpu/decode_bf16_avx3-inl.h"
#include "cpu/decode_routes-inl.h"
#include "cpu/e4m3_bf16.h"
#include "cpu/flash_decode.h"
#include "cpu/kv_rows.h"
#include "cpu/kernel_context.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace {

// The routes of one call: how key rows and value rows are read (decode_routes-inl.h).
template <class KeyRoute, class ValueRoute>
struct DecodeRoutes {
  KeyRoute keys;
  ValueRoute values;
};

// The union of the chunk's rows' keys within [kv_begin, kv_end) (ws.row_keys gets each
// row's row_columns), with the rows' queries loaded by the key route.
template <class KeyRoute>
SDPA_INLINE ColumnRange ChunkKeys(const KeyRoute& keys, const DecodeCall& call,
                                  const AttentionParams& p, const DecodeItem& item) {
  const int64_t L = p.q_len, G = p.group_size();
  ColumnRange visible{item.kv_end, item.kv_begin};
  for (int64_t r = 0; r < call.rows; ++r) {
    const int64_t h = item.hk * G + r / L, i = r % L;
    keys.LoadQuery(call, RowView(p.q, item.b, h), i, r);
    const ColumnRange& row_keys = call.ws.row_keys[r] = row_columns(p.mask, item.b, i, L, p.kv_len);
    const int64_t lo = std::max(row_keys.begin, item.kv_begin);
    const int64_t hi = std::min(row_keys.end, item.kv_end);
    if (lo < hi) {
      visible.begin = std::min(visible.begin, lo);
      visible.end = std::max(visible.end, hi);
    }
  }
  return visible;
}

// A key tile [j0, j0 + kBlockKv) of a chunk whose rows see keys `visible` in it.
struct DecodeTileSpan {
  int64_t j0;
  ColumnRange visible;
};

// One key tile of a chunk: scores, masks, the online softmax of call.state, P.v.
template <class Routes>
SDPA_INLINE void DecodeTile(const Routes& routes, const AttentionParams& p, const DecodeItem& item,
                            const DecodeCall& call, const DecodeTileSpan& tile) {
  const int64_t L = p.q_len, G = p.group_size(), j0 = tile.j0;
  const int64_t cols = std::min(kBlockKv, p.kv_len - j0);
  const int64_t c_begin = std::max<int64_t>(tile.visible.begin - j0, 0);
  const int64_t c_end = std::min(cols, tile.visible.end - j0);
  // Scores in whole vectors of keys: [g_begin, g_end) covers [c_begin, c_end) within the
  // tile; keys past kv_len score 0 (masked below).
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  routes.keys.ScoreTile(call, j0, c_begin / lanes * lanes, (c_end + lanes - 1) / lanes * lanes);
  DecodeScratch& ws = call.ws;
  for (int64_t r = 0; r < call.rows; ++r) {
    const int64_t h = item.hk * G + r / L, i = r % L;
    // Columns outside [c_begin, c_end) are outside every row's keys: MaskScoreRow sets
    // them (and every other masked key) to -inf.
    const DenseMaskRows dense(p.mask, item.b, h);
    MaskScoreRow({p.mask, dense, &ws.flex, item.b, h, L, p.kv_len}, {i, ws.row_keys[r], j0, cols},
                 ws.scores + r * kBlockKv);
  }
  routes.values.Softmax(call);
  if constexpr (!decltype(routes.values)::kRescalesAcc) ApplyRescale(call.state, call.rows, false);
  for (int64_t r = 0; r < call.rows && p.has_dropout(); ++r) {
    apply_dropout(p, {item.b, item.hk * G + r / L, r % L, j0}, ws.scores + r * kBlockKv, cols);
  }
  routes.values.Accumulate(call, j0, c_begin, c_end);
}

// One kv head's rows of a decode item: its running state (m / l / alpha in whole vectors
// of rows, as SoftmaxTile reads them; o in the item's partial) and its query slots.
struct HeadRows {
  HWY_ALIGN float m[kDecodeMaxRows];
  HWY_ALIGN float l[kDecodeMaxRows];
  HWY_ALIGN float alpha[kDecodeMaxRows];
  float* q;
  uint16_t* q_bf16;
};

// Rows ahead of the one it copies that StageTile requests: 16 rather than the in-place
// routes' kPrefetchRows (32), which made the float8 copy 5-10% slower and no other faster
// (sdpa_paged_decode, timed alternately in one process).
constexpr int64_t kStagePrefetchRows = 16;

// Copies the key and value rows `rows` (within [j0, j0 + kBlockKv)) of kv heads item.hk +
// [0, item.heads) into the stage (row j at row j - j0, all heads of a row side by side, as
// in the cache), in address order, requesting rows kStagePrefetchRows ahead (up to
// `last`) on the way. The stage's other rows of the tile are zeroed: the key routes score
// whole vectors of keys, also past the visible ones (scores they then mask), which must
// not read another item's rows or uninitialized memory.
SDPA_INLINE void StageTile(const AttentionParams& p, const DecodeItem& item, DecodeScratch& ws,
                           int64_t j0, ColumnRange rows, int64_t last) {
  const struct {
    RowView cache;
    char* stage;
  } sides[] = {{key_rows(p, item.b, item.hk), static_cast<char*>(ws.stage_k)},
               {value_rows(p, item.b, item.hk), static_cast<char*>(ws.stage_v)}};
  for (const auto& side : sides) {
    const int64_t elements = item.heads * side.cache.cols();
    const int64_t bytes = elements * side.cache.element_bytes();
    const int64_t stage_element_bytes =
        static_cast<int64_t>(element_size(ws.stage_dtype(side.cache.dtype())));
    const int64_t row_bytes = ws.heads * side.cache.cols() * stage_element_bytes;
    for (int64_t j = j0; j < j0 + kBlockKv; ++j) {
      char* dst = side.stage + (j - j0) * row_bytes;
      if (j < rows.begin || j >= rows.end) {
        std::memset(dst, 0, static_cast<size_t>(elements * stage_element_bytes));
        continue;
      }
      const char* ahead =
          static_cast<const char*>(side.cache.row_data(std::min(j + kStagePrefetchRows, last)));
      for (int64_t offset = 0; offset < bytes; offset += 64) {
        __builtin_prefetch(ahead + offset, 0, 2);
      }
#if HWY_TARGET == HWY_AVX3
      if (ws.stage_widens) {
        WidenE4M3Row(static_cast<const uint8_t*>(side.cache.row_data(j)), elements,
                     reinterpret_cast<uint16_t*>(dst));
        continue;
      }
#endif
      std::memcpy(dst, side.cache.row_data(j), static_cast<size_t>(bytes));
    }
  }
}

// DecodeChunk with key and value rows read by `routes`, for each head of the item: each
// head's rows read in the cache, or (a call of items of several heads: ws.heads > 1) key
// tile by key tile, each read by all the item's heads in turn (copied into the stage
// first where ws.stage_tiles).
template <class Routes>
void DecodeChunkWith(const Routes& routes, const AttentionParams& p, const DecodeItem& item,
                     DecodeScratch& ws, const SoftmaxRows* out) {
  const int64_t L = p.q_len, S = p.kv_len, G = p.group_size(), rows = G * L;
  using ValueRoute = decltype(routes.values);
  HeadRows heads[kDecodeMaxItemHeads];
  // Head h's call over rows `k_rows` / `v_rows`; first_tile_end is set once the chunk's
  // visible keys are known.
  const auto call_of = [&](int64_t h, const RowView& k_rows, const RowView& v_rows) {
    HeadRows& head = heads[h];
    return DecodeCall{k_rows,
                      v_rows,
                      ValueRoute::kInPlace ? &v_rows : nullptr,
                      ws,
                      head.q,
                      head.q_bf16,
                      rows,
                      S,
                      ws.head_dim_qk_padded,
                      ws.head_dim_vo_padded,
                      0,
                      static_cast<float>(p.scale),
                      SoftmaxRows{head.m, head.l, head.alpha, out[h].o, ws.head_dim_vo_padded}};
  };
  const auto head_item = [&](int64_t h) {
    return DecodeItem{item.b, item.hk + h, item.kv_begin, item.kv_end};
  };
  ColumnRange visible{item.kv_end, item.kv_begin};
  for (int64_t h = 0; h < item.heads; ++h) {
    const int64_t q_offset = h * kDecodeMaxRows * ws.head_dim_qk_padded;
    heads[h].q = ws.q + q_offset;
    heads[h].q_bf16 = ws.q_bf16 ? ws.q_bf16 + q_offset : nullptr;
    const RowView k_rows = key_rows(p, item.b, item.hk + h);
    const RowView v_rows = value_rows(p, item.b, item.hk + h);
    DecodeCall call = call_of(h, k_rows, v_rows);
    ResetRows(call.state, rows);
    // Every head sees the same keys: the mask's rows do not depend on the head.
    visible = ChunkKeys(routes.keys, call, p, head_item(h));
    if (ws.heads > 1 || visible.empty()) continue;
    // The tile loop requests rows kPrefetchRows ahead of those it reads: request the
    // chunk's first rows here, so that its start does not wait for them one demand miss
    // at a time.
    for (int64_t j = visible.begin; j < std::min(visible.begin + kPrefetchRows, visible.end); ++j) {
      Prefetch(k_rows, j);
      Prefetch(v_rows, j);
    }
    call.first_tile_end = visible.begin / kBlockKv * kBlockKv + kBlockKv;
    for (int64_t j0 = call.first_tile_end - kBlockKv; j0 < visible.end; j0 += kBlockKv) {
      DecodeTile(routes, p, head_item(h), call, {j0, visible});
    }
    routes.values.Finish(call);
  }
  if (ws.heads > 1 && !visible.empty()) {
    const int64_t first_tile = visible.begin / kBlockKv * kBlockKv;
    // Head h's rows of the stage of the tile at j0.
    const auto window = [&](const void* stage, const RowView& cache, int64_t h, int64_t j0) {
      const int64_t cols = cache.cols();
      const DType dtype = ws.stage_dtype(cache.dtype());
      return RowView::window(static_cast<const char*>(stage) + h * cols * element_size(dtype),
                             dtype, j0, ws.heads * cols, cols, cache.dequant_scale());
    };
    const RowView k_cache = key_rows(p, item.b, item.hk);
    const RowView v_cache = value_rows(p, item.b, item.hk);
    for (int64_t j0 = first_tile; j0 < visible.end; j0 += kBlockKv) {
      if (ws.stage_tiles) {
        StageTile(p, item, ws, j0,
                  {std::max(j0, visible.begin), std::min(j0 + kBlockKv, visible.end)},
                  visible.end - 1);
      }
      // The next tile's rows, which the heads request as they score this one, except where
      // the copy widens float8 codes: there the requests slowed the decode by 4-5%. Rows
      // read in place request only key rows here: the value route's P.v pass requests the
      // value rows it reads next (5% faster from a contiguous cache than both here).
      for (int64_t c = 0; c < kBlockKv && !ws.stage_widens; ++c) {
        const int64_t j = j0 + kBlockKv + c;
        const bool seen = j < visible.end;
        ws.ahead.k_rows[c] = seen ? static_cast<const char*>(k_cache.row_data(j)) : nullptr;
        ws.ahead.v_rows[c] =
            seen && ws.stage_tiles ? static_cast<const char*>(v_cache.row_data(j)) : nullptr;
      }
      for (int64_t h = 0; h < item.heads; ++h) {
        const RowView k_cache_h = key_rows(p, item.b, item.hk + h);
        const RowView v_cache_h = value_rows(p, item.b, item.hk + h);
        const RowView k_rows = ws.stage_tiles ? window(ws.stage_k, k_cache_h, h, j0) : k_cache_h;
        const RowView v_rows = ws.stage_tiles ? window(ws.stage_v, v_cache_h, h, j0) : v_cache_h;
        DecodeCall call = call_of(h, k_rows, v_rows);
        call.first_tile_end = first_tile + kBlockKv;
        if (!ws.stage_widens) {
          call.next_tile = &ws.ahead;
          call.next_k_bytes = k_cache.cols() * k_cache.element_bytes();
          call.next_v_bytes = ws.stage_tiles ? v_cache.cols() * v_cache.element_bytes() : 0;
          call.next_head = h;
        }
        DecodeTile(routes, p, head_item(h), call, {j0, visible});
        if (j0 + kBlockKv >= visible.end) routes.values.Finish(call);
      }
    }
  }
  for (int64_t h = 0; h < item.heads; ++h) {
    std::copy(heads[h].m, heads[h].m + rows, out[h].m);
    std::copy(heads[h].l, heads[h].l + rows, out[h].l);
  }
}

}  // namespace

void DecodeChunk(const AttentionParams& p, const DecodeItem& item, DecodeScratch& ws,
                 const SoftmaxRows* out) {
  WithDecodeRoutes(ws, p.has_dropout(), [&](const auto& keys, const auto& values) HWY_ATTR {
    const DecodeRoutes<std::decay_t<decltype(keys)>, std::decay_t<decltype(values)>> routes{keys,
                                                                                            values};
    DecodeChunkWith(routes, p, item, ws, out);
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
