// Per-ISA: the decode routes (decode_routes-inl.h) of the AVX-512 level through vdpbf16ps
// (bf16_decode.h): bf16 (or float8_e4m3fn, widened as loaded) key and value rows read in
// place, q and P as bf16 bits. Other targets take the float32 routes only
// (decode_uses_bf16_dot() holds only at this level). WithDecodeRoutes chooses a call's
// routes on every target. Include after foreach_target.h.

#if defined(SDPA_CPU_DECODE_BF16_AVX3_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_DECODE_BF16_AVX3_INL_H_
#undef SDPA_CPU_DECODE_BF16_AVX3_INL_H_
#else
#define SDPA_CPU_DECODE_BF16_AVX3_INL_H_
#endif

#include <algorithm>
#include <type_traits>

#include "core/kernel_inline.h"
#include "cpu/bf16_decode.h"
#include "cpu/bf16_dot.h"
#include "cpu/decode_routes-inl.h"
#include "cpu/softmax_bf16-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3
// What the rows are multiplied by: a float8 cache's scale (the table widens codes to their
// values; a staged float8 tile holds them widened to bf16 already), 1 for a bf16 cache.
SDPA_INLINE float RowDequant(const RowView& rows) { return rows.dequant_scale(); }

/// Key route: key rows of unit stride by vdpbf16ps, T = uint16_t for bf16 rows or uint8_t
/// for a float8 cache's; q as bf16 bits, unscaled (the scale, and a float8 cache's key
/// scale, multiply the float32 scores).
template <class T>
struct Bf16Keys {
  SDPA_INLINE void LoadQuery(const DecodeCall& call, const RowView& q_rows, int64_t i,
                             int64_t r) const {
    const int64_t E = call.k_rows.cols();
    const uint16_t* src = static_cast<const uint16_t*>(q_rows.row_data(i));
    uint16_t* dst = call.q_bf16 + r * call.e_pad;
    for (int64_t e = 0; e < E; ++e) dst[e] = src[e * q_rows.col_stride()];
    std::fill(dst + E, dst + call.e_pad, uint16_t{0});
  }
  // 16 keys at a time, each group requesting the rows kPrefetchRows ahead of it (a whole
  // tile's requests at once overflow the miss queues and are dropped). Value rows are
  // requested by the P.v pass of the tile before theirs, except the first tile's,
  // requested here with the keys.
  SDPA_INLINE void ScoreTile(const DecodeCall& call, int64_t j0, int64_t g_begin,
                             int64_t g_end) const {
    const RowView& k_rows = call.k_rows;
    const int64_t S = call.S;
    for (int64_t c = g_begin; c < g_end; c += 16) {
      for (int64_t k = c; k < c + 16; ++k) {
        const int64_t ahead = std::min(j0 + k + kPrefetchRows, S - 1);
        Prefetch(k_rows, ahead);
        if (call.values_ahead && ahead < call.first_tile_end) Prefetch(*call.values_ahead, ahead);
      }
      RequestNextTile(call, c, c + 16);
      Bf16ScoreKeys<T>({call.q_bf16, call.e_pad, call.rows},
                       {static_cast<const T*>(k_rows.row_data(j0 + c)), k_rows.row_stride(),
                        k_rows.cols(), S - j0 - c},
                       16, call.scale * RowDequant(k_rows), {call.ws.scores + c, kBlockKv});
    }
  }
};

/// Value route: value rows of unit stride (T as in Bf16Keys) by vdpbf16ps, with P rounded
/// to bf16 (as the FLASH forward's bf16 path does); the accumulators come out in the order
/// ValueOrderToElements restores, and Finish applies a float8 cache's value scale.
template <class T>
struct Bf16Values {
  static constexpr bool kInPlace = true;
  static constexpr bool kRescalesAcc = true;  // Bf16AccumulateValues applies alpha
  /// P goes to bf16 as the softmax computes it, except where dropout needs float32 P.
  bool p_in_bf16;
  SDPA_INLINE void Softmax(const DecodeCall& call) const {
    DecodeScratch& ws = call.ws;
    const ScoreRows scores{ws.scores, call.rows, 1.0f};
    if (p_in_bf16) {
      SoftmaxTileToBf16(scores, call.state, ws.p_bf16);
    } else {
      SoftmaxTile(scores, nullptr, call.state);
    }
  }
  SDPA_INLINE void Accumulate(const DecodeCall& call, int64_t j0, int64_t c_begin,
                              int64_t c_end) const {
    DecodeScratch& ws = call.ws;
    const RowView& v_rows = call.v_rows;
    // Keys in pairs from an even column; P is 0 at masked columns (and past c_end).
    const int64_t pair_begin = c_begin / 2 * 2;
    for (int64_t r = 0; r < call.rows && !p_in_bf16; ++r) {
      ConvertRowToBf16(ws.scores + r * kBlockKv, ws.p_bf16 + r * kBlockKv, kBlockKv);
    }
    // The rows by address: one pass over the tile, also where it spans pages of a paged
    // cache (one pass per page loaded and stored the accumulators four times per tile at
    // page size 16). The P.v pass requests the next tile's value rows (past the chunk's
    // end too: the next chunk is usually this thread's next item) a pair per pair it reads:
    // memory then streams values during P.v and keys during the scores, instead of idling
    // through P.v with both requested in bursts during the scores.
    const T* rows[kBlockKv];
    const T* next_rows[kBlockKv];
    for (int64_t c = pair_begin; c < c_end; ++c) {
      rows[c] = static_cast<const T*>(v_rows.row_data(j0 + c));
    }
    const int64_t next =
        v_rows.is_window() ? 0 : std::clamp<int64_t>(call.S - j0 - kBlockKv, 0, kBlockKv);
    for (int64_t c = 0; c < next; ++c) {
      next_rows[c] = static_cast<const T*>(v_rows.row_data(j0 + kBlockKv + c));
    }
    Bf16AccumulateValues<T>({ws.p_bf16 + pair_begin, kBlockKv, call.rows},
                            {rows + pair_begin, 0, v_rows.cols(), c_end - pair_begin},
                            {call.state.alpha, call.state.o, call.ev_pad},
                            {next_rows, 0, v_rows.cols(), next});
  }
  SDPA_INLINE void Finish(const DecodeCall& call) const {
    static_assert(kDecodeRowPad % kValueBlock == 0);
    for (int64_t r = 0; r < call.rows; ++r) {
      ValueOrderToElements(call.state.o + r * call.ev_pad, call.ev_pad);
    }
    if (const float scale = RowDequant(call.v_rows); scale != 1.0f) {
      ScaleRow(call.state.o, call.rows * call.ev_pad, scale);
    }
  }
};

/// Calls f(key route, value route) with the routes of a call whose scratch is ws.
template <class F>
SDPA_INLINE void WithDecodeRoutes(const DecodeScratch& ws, bool has_dropout, const F& f) {
  if (!ws.bf16_keys) return WithFloat32Routes(ws, f);
  if (ws.kv_rows == KvRows::kFloat8E4M3FN && !ws.stage_widens) {
    if (ws.bf16_values) return f(Bf16Keys<uint8_t>(), Bf16Values<uint8_t>{!has_dropout});
    return f(Bf16Keys<uint8_t>(), ValuesInTile());
  }
  if (ws.bf16_values) return f(Bf16Keys<uint16_t>(), Bf16Values<uint16_t>{!has_dropout});
  f(Bf16Keys<uint16_t>(), ValuesInTile());
}
#else
/// Calls f(key route, value route) with the routes of a call whose scratch is ws.
template <class F>
SDPA_INLINE void WithDecodeRoutes(const DecodeScratch& ws, bool, const F& f) {
  WithFloat32Routes(ws, f);
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_DECODE_BF16_AVX3_INL_H_
