// Key-read and value-accumulate routes of the split-KV decode chunk (flash_decode_tile.cc),
// as small types chosen once per call: DecodeChunk's body is a template on one key route
// and one value route, so the tile loop branches on no route. Key routes load q and score
// a tile's keys into ws.scores; value routes run the softmax and add P.v to the
// accumulators. Here: rows converted into the float32 tile (other strides, any target)
// and rows read in place (decode_rows-inl.h); the vdpbf16ps routes are in
// decode_bf16_avx3-inl.h. Per-target code: include after foreach_target.h.

#if defined(SDPA_CPU_DECODE_ROUTES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_DECODE_ROUTES_INL_H_
#undef SDPA_CPU_DECODE_ROUTES_INL_H_
#else
#define SDPA_CPU_DECODE_ROUTES_INL_H_
#endif

#include <algorithm>
#include <type_traits>

#include "core/kernel_inline.h"
#include "cpu/decode_rows-inl.h"
#include "cpu/flash_decode.h"
#include "cpu/gemm-inl.h"
#include "cpu/reduce_lanes-inl.h"
#include "cpu/rows.h"
#include "cpu/rows_ahead.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// One DecodeChunk call as its routes see it: the kv head's key and value rows, the
/// working set, the head's query rows (q [rows, e_pad] as float32, or as bf16 bits by the
/// vdpbf16ps key route; slots of ws), accumulators acc [rows, ev_pad], kv_len S, the end of
/// the chunk's first tile (whose value rows the key pass requests when `values_ahead` is
/// set: the value route reads rows in place) and the softmax scale.
struct DecodeCall {
  const RowView& k_rows;
  const RowView& v_rows;
  const RowView* values_ahead;
  DecodeScratch& ws;
  float* q;
  uint16_t* q_bf16;
  int64_t rows, S, e_pad, ev_pad, first_tile_end;
  float scale;
  /// The chunk's online-softmax state; o holds the output rows [rows, ev_pad].
  SoftmaxRows state;
  /// A staged call's next tile (null otherwise), this head's index in the item and the
  /// bytes of one head's key and value row: the head's slices, which the key route
  /// requests as it scores (RequestNextTile).
  const StagedTileAhead* next_tile = nullptr;
  int64_t next_head = 0, next_k_bytes = 0, next_v_bytes = 0;
};

// dst[0, padded) = row r of `rows` as float32 (times `multiplier`), zero beyond cols():
// q rows, and key / value rows not read in place (other strides, the scalar target).
SDPA_INLINE void LoadRow(const RowView& rows, int64_t r, int64_t padded, float* HWY_RESTRICT dst,
                         float multiplier = 1.0f) {
  rows.load(r, dst, multiplier);
  std::fill(dst + rows.cols(), dst + padded, 0.0f);
}

// Rows are read once, one after another, each a few hundred bytes: requesting the row
// kPrefetchRows ahead keeps enough misses in flight to stream at memory bandwidth. The
// requests go to L2 (prefetcht1): as L1 prefetches they held the L1 miss buffers the
// demand loads need (one thread streamed 8.8 GB/s that way, 10.9 GB/s into L2).
inline constexpr int64_t kPrefetchRows = 32;

SDPA_INLINE void Prefetch(const RowView& rows, int64_t r) {
  if (rows.is_window()) return;
  const char* row = static_cast<const char*>(rows.row_data(r));
  const int64_t bytes = rows.cols() * rows.col_stride() * rows.element_bytes();
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset, 0, 2);
}

// Requests this head's slices of a staged call's next-tile rows [c_begin, c_end) (none for
// other calls) as the key route scores its keys [c_begin, c_end): spread over the route's
// groups, as a tile's requests at once overflow the miss queues.
SDPA_INLINE void RequestNextTile(const DecodeCall& call, int64_t c_begin, int64_t c_end) {
  const StagedTileAhead* next = call.next_tile;
  if (next == nullptr) return;
  for (int64_t c = c_begin; c < std::min(c_end, kBlockKv); ++c) {
    if (next->k_rows[c] == nullptr) return;
    const char* k = next->k_rows[c] + call.next_head * call.next_k_bytes;
    const char* v = next->v_rows[c] + call.next_head * call.next_v_bytes;
    for (int64_t offset = 0; offset < call.next_k_bytes; offset += 64) {
      __builtin_prefetch(k + offset, 0, 2);
    }
    for (int64_t offset = 0; offset < call.next_v_bytes; offset += 64) {
      __builtin_prefetch(v + offset, 0, 2);
    }
  }
}

// The rows of the tile after the one at j0, for the P.v passes to request. Past the chunk's
// end too: the next chunk is usually this thread's next item (flash_decode.cpp).
SDPA_INLINE RowsAhead NextTileRows(const RowView& rows, int64_t j0, int64_t S) {
  const int64_t next = j0 + kBlockKv;
  if (next >= S || rows.is_window()) return {nullptr, 0, rows.element_bytes()};
  // Rows one stride apart only (a paged view's run ends with its page).
  return {rows.row_data(next), std::min({S - next, kBlockKv, rows.rows_in_run(next)}),
          rows.element_bytes()};
}

// The next tile's rows that NextTileRows' run of `run` rows leaves out (the later pages
// of a paged cache), requested one by one; none for strided rows.
SDPA_INLINE void PrefetchRestOfNextTile(const RowView& rows, int64_t j0, int64_t S, int64_t run) {
  const int64_t next = j0 + kBlockKv, end = rows.is_window() ? next : std::min(S, next + kBlockKv);
  for (int64_t r = next + run; r < end; ++r) Prefetch(rows, r);
}

// ws.scores[r * kBlockKv + c] = q_r . key_c for rows r < call.rows and keys c in [c0, c1)
// (multiples of the lane count): q_r row r of call.q, key_c row c of ws.tile (both e_pad
// long).
SDPA_INLINE void ScoreKeys(const DecodeCall& call, int64_t c0, int64_t c1) {
  const hn::ScalableTag<float> d;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(d));
  const float* HWY_RESTRICT q = call.q;
  const float* HWY_RESTRICT keys = call.ws.tile;
  float* HWY_RESTRICT scores = call.ws.scores;
  const int64_t rows = call.rows, e_pad = call.e_pad;
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

/// Key route: key rows converted into ws.tile as float32 (any stride and target).
struct KeysInTile {
  /// Query row r of the call <- row i of q_rows, times the scale.
  SDPA_INLINE void LoadQuery(const DecodeCall& call, const RowView& q_rows, int64_t i,
                             int64_t r) const {
    LoadRow(q_rows, i, call.e_pad, call.q + r * call.e_pad, call.scale);
  }
  /// Scores of the tile at j0 for keys [g_begin, g_end) (whole vectors; keys past kv_len
  /// score 0, masked by the caller).
  SDPA_INLINE void ScoreTile(const DecodeCall& call, int64_t j0, int64_t g_begin,
                             int64_t g_end) const {
    DecodeScratch& ws = call.ws;
    for (int64_t c = g_begin; c < g_end; ++c) {
      float* key = ws.tile + c * call.e_pad;
      if (j0 + c >= call.S) {
        std::fill(key, key + call.e_pad, 0.0f);
        continue;
      }
      Prefetch(call.k_rows, std::min(j0 + c + kPrefetchRows, call.S - 1));
      RequestNextTile(call, c, c + 1);
      LoadRow(call.k_rows, j0 + c, call.e_pad, key);
    }
    ScoreKeys(call, g_begin, g_end);
  }
};

/// Value routes whose P is float32: the online softmax of tile_ops-inl.h, and the
/// accumulators rescaled by the caller.
struct Float32Probabilities {
  static constexpr bool kRescalesAcc = false;
  /// Online softmax of ws.scores' rows into call.state: P over the scores.
  SDPA_INLINE void Softmax(const DecodeCall& call) const {
    SoftmaxTile({call.ws.scores, call.rows, 1.0f}, nullptr, call.state);
  }
};

/// Value route: value rows converted into ws.tile as float32 (any stride and target).
struct ValuesInTile : Float32Probabilities {
  static constexpr bool kInPlace = false;
  /// acc += P[:, c_begin, c_end) . value rows j0 + [c_begin, c_end).
  SDPA_INLINE void Accumulate(const DecodeCall& call, int64_t j0, int64_t c_begin,
                              int64_t c_end) const {
    DecodeScratch& ws = call.ws;
    const int64_t ev_pad = call.ev_pad;
    for (int64_t c = c_begin; c < c_end; ++c) {
      Prefetch(call.v_rows, std::min(j0 + c + kPrefetchRows, call.S - 1));
      LoadRow(call.v_rows, j0 + c, ev_pad, ws.tile + c * ev_pad);
    }
    // P.v with register-blocked accumulators (the rows' outputs stay in registers over
    // the tile's keys instead of a load and store per key).
    Gemm({call.rows, ev_pad, c_end - c_begin}, {ws.scores + c_begin, kBlockKv},
         {ws.tile + c_begin * ev_pad, ev_pad}, {call.state.o, ev_pad}, GemmOutput::kAccumulate);
  }
  /// Puts the accumulators in element order (they are).
  SDPA_INLINE void Finish(const DecodeCall&) const {}
};

#if HWY_TARGET != HWY_SCALAR
// f(std::integral_constant<KvRows, kind>()): the in-place kernels compiled per row type.
template <class F>
SDPA_INLINE void ForKvRows(KvRows kind, const F& f) {
  switch (kind) {
    case KvRows::kBFloat16: return f(std::integral_constant<KvRows, KvRows::kBFloat16>());
    case KvRows::kFloat16: return f(std::integral_constant<KvRows, KvRows::kFloat16>());
    case KvRows::kFloat32: return f(std::integral_constant<KvRows, KvRows::kFloat32>());
    case KvRows::kFloat8E4M3FN:
      return f(std::integral_constant<KvRows, KvRows::kFloat8E4M3FN>());
  }
}

// Scores of keys j0 + [c, c + Lanes) read in place into ws.scores' columns [c, c + Lanes)
// (keys past kv_len repeat the last key: the caller masks their scores). Requests the key
// rows kPrefetchRows ahead, and the value rows of call.values_ahead (null: none) while
// they belong to the chunk's first tile (the P.v pass of the tile before requests the
// others).
template <KvRows kRows>
SDPA_INLINE void ScoreKeyGroupInPlace(const DecodeCall& call, int64_t j0, int64_t c) {
  using T = KvElement<kRows>;
  constexpr int64_t kBlock = SplitBlock(), lanes = kBlock / 2;
  const RowView& k_rows = call.k_rows;
  const RowView* values = call.values_ahead;
  const int64_t key0 = j0 + c, S = call.S, first_tile_end = call.first_tile_end;
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
  RequestNextTile(call, c, c + lanes);
  if (full < E) GatherTails(keys, lanes, full, E, tails);
  ScoreKeysInPlace<kRows>({call.q, call.e_pad, call.rows},
                          {keys, lanes, E, full, full < E ? tails : nullptr},
                          {call.ws.scores + c, kBlockKv, call.rows});
}

// call.state.o (rows in kRows' layout) += P[:, c_begin, c_end) . value rows
// j0 + [c_begin, c_end) read in place, P in ws.scores; requests the rows of the tile after
// the one at j0 on the way.
template <KvRows kRows>
SDPA_INLINE void AccumulateTileInPlace(const DecodeCall& call, int64_t j0, int64_t c_begin,
                                       int64_t c_end) {
  using T = KvElement<kRows>;
  constexpr int64_t kBlock = SplitBlock();
  const RowView& v_rows = call.v_rows;
  const int64_t first = j0 + c_begin, n = c_end - c_begin;
  const int64_t Ev = v_rows.cols(), full = Ev / kBlock * kBlock;
  const T* values[kBlockKv];
  HWY_ALIGN T tails[kBlockKv * kBlock];
  for (int64_t k = 0; k < n; ++k) values[k] = static_cast<const T*>(v_rows.row_data(first + k));
  if (full < Ev) GatherTails(values, n, full, Ev, tails);
  const RowsAhead ahead = NextTileRows(v_rows, j0, call.S);
  PrefetchRestOfNextTile(v_rows, j0, call.S, ahead.n);
  AccumulateValuesInPlace<kRows>({call.ws.scores + c_begin, kBlockKv, call.rows},
                                 {values, n, Ev, full, full < Ev ? tails : nullptr},
                                 {call.state.o, call.ev_pad, call.rows},
                                 {ahead, v_rows.row_stride()});
}

// What the accumulators of rows read in place are multiplied by: a float8 cache's scale
// times the factor its in-place conversion leaves out (decode_rows-inl.h), else 1.
SDPA_INLINE float InPlaceDequant(KvRows kind, const RowView& rows) {
  return kind == KvRows::kFloat8E4M3FN ? rows.dequant_scale() * kE4M3FNInPlaceFactor : 1.0f;
}

/// Key route: key rows of unit stride read in place (widened in registers). bf16 rows
/// need q in the split layout (decode_rows-inl.h); a float8 cache's key scale goes into q.
struct KeysInPlace {
  KvRows kind;
  SDPA_INLINE void LoadQuery(const DecodeCall& call, const RowView& q_rows, int64_t i,
                             int64_t r) const {
    float* q = call.q + r * call.e_pad;
    LoadRow(q_rows, i, call.e_pad, q, call.scale * InPlaceDequant(kind, call.k_rows));
    if (kind == KvRows::kBFloat16) SplitRow(q, round_up(call.k_rows.cols(), SplitBlock()));
  }
  SDPA_INLINE void ScoreTile(const DecodeCall& call, int64_t j0, int64_t g_begin,
                             int64_t g_end) const {
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
    ForKvRows(kind, [&](auto rows_kind) HWY_ATTR {
      for (int64_t c = g_begin; c < g_end; c += lanes) {
        ScoreKeyGroupInPlace<decltype(rows_kind)::value>(call, j0, c);
      }
    });
  }
};

/// Value route: value rows of unit stride read in place (widened in registers); bf16 rows
/// accumulate in the split layout, put back in order by Finish, which also applies a
/// float8 cache's value scale.
struct ValuesInPlace : Float32Probabilities {
  static constexpr bool kInPlace = true;
  KvRows kind;
  SDPA_INLINE void Accumulate(const DecodeCall& call, int64_t j0, int64_t c_begin,
                              int64_t c_end) const {
    ForKvRows(kind, [&](auto rows_kind) HWY_ATTR {
      AccumulateTileInPlace<decltype(rows_kind)::value>(call, j0, c_begin, c_end);
    });
  }
  SDPA_INLINE void Finish(const DecodeCall& call) const {
    if (kind == KvRows::kFloat8E4M3FN) {
      ScaleRow(call.state.o, call.rows * call.ev_pad, InPlaceDequant(kind, call.v_rows));
    }
    if (kind != KvRows::kBFloat16) return;
    const int64_t split = round_up(call.v_rows.cols(), SplitBlock());
    for (int64_t r = 0; r < call.rows; ++r) SplitRow(call.state.o + r * call.ev_pad, split, true);
  }
};
#endif  // HWY_TARGET != HWY_SCALAR

/// Calls f(key route, value route) with the routes of a call whose rows do not go through
/// vdpbf16ps: in place where the rows allow it (not on the scalar target).
template <class F>
SDPA_INLINE void WithFloat32Routes([[maybe_unused]] const DecodeScratch& ws, const F& f) {
#if HWY_TARGET != HWY_SCALAR
  if (ws.key_rows_in_place) {
    if (ws.value_rows_in_place) return f(KeysInPlace{ws.kv_rows}, ValuesInPlace{{}, ws.kv_rows});
    return f(KeysInPlace{ws.kv_rows}, ValuesInTile());
  }
  if (ws.value_rows_in_place) return f(KeysInTile(), ValuesInPlace{{}, ws.kv_rows});
#endif
  f(KeysInTile(), ValuesInTile());
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_DECODE_ROUTES_INL_H_
