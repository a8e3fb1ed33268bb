// Key and value rows read in place by the decode path where vdpbf16ps does not take them:
// bfloat16, float16 or float32 rows of unit stride, each block of 2N elements (N float
// lanes) loaded as two float32 vectors in registers. No float32 copy of the tile: the
// decode path reads every key and value once, so converting or copying through a tile
// cost it more than its FMAs.
//
// bfloat16: two adjacent elements loaded as one 32-bit lane widen with one op each (the
// even element is the lane shifted left by 16, the odd one the lane with its low half
// cleared), no shuffle. The float32 operands are then in "split" layout: each block holds
// its N even elements, then its N odd ones. A dot product with a split q row sums the same
// products in another order; P.v accumulates split output rows, which SplitRow puts back
// in order once per chunk. float16: each half of the block widens in order (vcvtph2ps on
// x86); float32 is loaded as is: both keep the plain layout. Per-target code (not
// HWY_SCALAR, whose one-lane vectors hold no pair): include after foreach_target.h.

#if defined(SDPA_CPU_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_DECODE_ROWS_INL_H_
#undef SDPA_CPU_DECODE_ROWS_INL_H_
#else
#define SDPA_CPU_DECODE_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/kernel_inline.h"
#include "cpu/flash_decode.h"
#include "cpu/reduce_lanes-inl.h"
#include "cpu/rows.h"
#include "cpu/rows_ahead.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

/// The stored element of KvRows kind kRows (half and float8 types as their bits).
template <KvRows kRows>
using KvElement = std::conditional_t<
    kRows == KvRows::kFloat32, float,
    std::conditional_t<kRows == KvRows::kFloat8E4M3FN, uint8_t, uint16_t>>;

/// Elements per block: two float32 vectors.
SDPA_INLINE constexpr int64_t SplitBlock() {
  return 2 * static_cast<int64_t>(hn::MaxLanes(hn::ScalableTag<float>()));
}

/// Puts row[0, n) (n a multiple of SplitBlock()) into split layout, in place; with
/// `unsplit`, back from it.
SDPA_INLINE void SplitRow(float* HWY_RESTRICT row, int64_t n, bool unsplit = false) {
  constexpr int64_t B = SplitBlock(), N = B / 2;
  float block[B];
  for (int64_t e = 0; e < n; e += B) {
    std::copy(row + e, row + e + B, block);
    for (int64_t j = 0; j < B; ++j) {
      const int64_t split = j % 2 * N + j / 2;  // element j's place in split layout
      if (unsplit) {
        row[e + j] = block[split];
      } else {
        row[e + split] = block[j];
      }
    }
  }
}

/// Float32 rows of a kernel below: row r at data + r * stride, r < rows (T = const float
/// for the q and P rows read, float for the scores and accumulators written).
template <typename T>
struct FloatRows {
  T* data;
  int64_t stride;
  int64_t rows;

  T* row(int64_t r) const { return data + r * stride; }
  /// Rows [r, rows).
  FloatRows from(int64_t r) const { return {row(r), stride, rows - r}; }
};

/// Key or value rows of unit stride read in place, `cols` elements each: rows[k] for
/// k < n, their first `full` elements (cols rounded down to a multiple of SplitBlock())
/// read from the rows, the rest from `tails` (GatherTails; null when full == cols).
template <KvRows kRows>
struct InPlaceRows {
  const KvElement<kRows>* const* rows;
  int64_t n;
  int64_t cols;
  int64_t full;
  const KvElement<kRows>* tails;
};

/// Rows requested into L2 while a P.v pass reads its own (rows_ahead.h): `rows`, spaced
/// row_stride elements apart.
struct RowsToRequest {
  RowsAhead rows;
  int64_t row_stride;
};

/// tails[k * SplitBlock() + t] = rows[k][full + t] for t < cols - full, 0 up to the block's
/// end, k < n: the partial last block of each row, so the kernels below load whole blocks
/// without reading past a row.
template <typename T>
SDPA_INLINE void GatherTails(const T* const* rows, int64_t n, int64_t full, int64_t cols,
                             T* HWY_RESTRICT tails) {
  constexpr int64_t B = SplitBlock();
  for (int64_t k = 0; k < n; ++k) {
    T* dst = tails + k * B;
    std::copy(rows[k] + full, rows[k] + cols, dst);
    std::fill(dst + (cols - full), dst + B, T{0});
  }
}

namespace detail {

// The 2N float8_e4m3fn elements at src as two float32 vectors, each element its value /
// kE4M3FNInPlaceFactor. AVX2 and AVX-512: a code sign-extended to 16 bits and shifted left
// by 7 is S.S.EEEE.MMM.0000000; clearing the second S gives the float16
// S.0EEEE.MMM0000000, whose value is the E4M3 value / 2^8 for normals and subnormals alike
// (float16's exponent bias is 8 more than E4M3's), and vcvtph2ps widens it exactly. E4M3's
// NaN, S.1111.111, gets bit 14 set instead: the float16 S.11111.1110000000, a NaN. Five
// integer ops per 16 codes, where building each float16 from the code's magnitude and
// sign took nine per 8: the float8 decode at the AVX2 level is bound by these ops.
template <class D>
SDPA_INLINE void LoadE4M3(D d, const uint8_t* HWY_RESTRICT src, hn::Vec<D>& first,
                          hn::Vec<D>& second) {
#if HWY_TARGET > HWY_AVX2
  // Below AVX2 Highway emulates the float16 promotion without NaN (see LoadBlock).
  HWY_ALIGN float widened[2 * HWY_MAX_BYTES / sizeof(float)];
  const int64_t n = 2 * static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < n; ++i) widened[i] = kE4M3FNValues[src[i]] / kE4M3FNInPlaceFactor;
  first = hn::Load(d, widened);
  second = hn::Load(d, widened + hn::Lanes(d));
#else
  const hn::Repartition<int16_t, D> d16;
  const hn::Half<decltype(d16)> d16_half;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::Rebind<hwy::float16_t, D> dh;
  const auto bits = [&](uint16_t b) { return hn::Set(d16, static_cast<int16_t>(b)); };
  const auto shifted =
      hn::ShiftLeft<7>(hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(src))));
  // Bit 14 of shifted + 2^7 is S xor NaN (the carry out of EEEE.MMM reaches it only from
  // the NaN code): flipping bit 14 by it clears the second S of every other code and
  // makes it 1 in the NaN codes.
  const auto half = hn::Xor(shifted, hn::And(hn::Add(shifted, bits(0x0080)), bits(0x4000)));
  first = hn::PromoteTo(d, hn::BitCast(dh, hn::LowerHalf(d16_half, half)));
  second = hn::PromoteTo(d, hn::BitCast(dh, hn::UpperHalf(d16_half, half)));
#endif
}

// The two float32 vectors of the 2N elements at src: for bfloat16 its even and odd
// elements (split layout), otherwise its first and last N (float8_e4m3fn: each value /
// kE4M3FNInPlaceFactor).
template <KvRows kRows, class D>
SDPA_INLINE void LoadBlock(D d, const KvElement<kRows>* HWY_RESTRICT src, hn::Vec<D>& first,
                           hn::Vec<D>& second) {
  if constexpr (kRows == KvRows::kFloat8E4M3FN) {
    LoadE4M3(d, src, first, second);
  } else if constexpr (kRows == KvRows::kBFloat16) {
    const hn::RebindToUnsigned<D> du;
    const hn::Repartition<uint16_t, D> d16;
    const auto bits = hn::BitCast(du, hn::LoadU(d16, src));
    first = hn::BitCast(d, hn::ShiftLeft<16>(bits));
    second = hn::BitCast(d, hn::And(bits, hn::Set(du, 0xFFFF0000u)));
  } else if constexpr (kRows == KvRows::kFloat16) {
#if HWY_TARGET > HWY_AVX2
    // Below AVX2 Highway 1.0.3 emulates the promotion and turns inf and NaN into finite
    // values (a NaN key then no longer reaches the output): sdpa::float16's conversion.
    HWY_ALIGN float widened[2 * HWY_MAX_BYTES / sizeof(float)];
    const int64_t n = 2 * static_cast<int64_t>(hn::Lanes(d));
    for (int64_t i = 0; i < n; ++i) {
      float16 h;
      h.bits = src[i];
      widened[i] = static_cast<float>(h);
    }
    first = hn::Load(d, widened);
    second = hn::Load(d, widened + hn::Lanes(d));
#else
    const hn::Rebind<hwy::float16_t, D> d16;
    const auto* half = reinterpret_cast<const hwy::float16_t*>(src);
    first = hn::PromoteTo(d, hn::LoadU(d16, half));
    second = hn::PromoteTo(d, hn::LoadU(d16, half + hn::Lanes(d)));
#endif
  } else {
    first = hn::LoadU(d, src);
    second = hn::LoadU(d, src + hn::Lanes(d));
  }
}

// Requests block `e` of row k of `ahead` (rows `stride` elements apart).
template <KvRows kRows>
SDPA_INLINE void PrefetchBlock(const RowsAhead& ahead, int64_t stride, int64_t k, int64_t e) {
  constexpr int64_t kBytes = SplitBlock() * static_cast<int64_t>(sizeof(KvElement<kRows>));
  const char* block = static_cast<const char*>(ahead.rows) +
                      (k * stride + e) * static_cast<int64_t>(sizeof(KvElement<kRows>));
  for (int64_t offset = 0; offset < kBytes; offset += 64) {
    __builtin_prefetch(block + offset, 0, 2);
  }
}

// Block e (elements [e, e + SplitBlock())) of value rows k < n: at rows[k] + e, or the
// k-th block of `tails` when not null (the rows' partial last blocks, GatherTails).
template <KvRows kRows>
struct ValueBlock {
  const KvElement<kRows>* const* rows;
  const KvElement<kRows>* tails;
  int64_t e;
  int64_t n;
};

// acc.row(r)[e, e + SplitBlock()) (rows in kRows' layout) += sum over k < values.n of
// p.row(r)[k] * value row k's block e, for r < R. Requests block e of row k of `ahead` as
// it reads value row k's.
template <KvRows kRows, int R, class D>
SDPA_INLINE void AccumulateBlock(D d, const FloatRows<const float>& p,
                                 const ValueBlock<kRows>& values, const FloatRows<float>& acc,
                                 const RowsToRequest& ahead) {
  using V = hn::Vec<D>;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(d));
  // The fields as scalars for the key loop: read through `ahead` there, the prefetch
  // address was recomputed per key instead of advanced by a stride (decode 2-3% slower).
  const float* HWY_RESTRICT p_data = p.data;
  float* HWY_RESTRICT acc_data = acc.data;
  const int64_t p_stride = p.stride, acc_stride = acc.stride, e = values.e, n = values.n;
  const KvElement<kRows>* const* value_rows = values.rows;
  const KvElement<kRows>* tails = values.tails;
  const RowsAhead& rows_ahead = ahead.rows;
  const int64_t ahead_stride = ahead.row_stride;
  V first[R], second[R];
  for (int r = 0; r < R; ++r) {
    first[r] = hn::LoadU(d, acc_data + r * acc_stride + e);
    second[r] = hn::LoadU(d, acc_data + r * acc_stride + e + N);
  }
  for (int64_t k = 0; k < n; ++k) {
    if (k < rows_ahead.n) PrefetchBlock<kRows>(rows_ahead, ahead_stride, k, e);
    V v0, v1;
    LoadBlock<kRows>(d, tails ? tails + k * 2 * N : value_rows[k] + e, v0, v1);
    for (int r = 0; r < R; ++r) {
      const V pk = hn::Set(d, p_data[r * p_stride + k]);
      first[r] = hn::MulAdd(pk, v0, first[r]);
      second[r] = hn::MulAdd(pk, v1, second[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    hn::StoreU(first[r], d, acc_data + r * acc_stride + e);
    hn::StoreU(second[r], d, acc_data + r * acc_stride + e + N);
  }
}

// Scores of R q rows (kRows' layout) against the N = Lanes keys of ScoreKeysInPlace: K
// keys at a time, each key block loaded once for all R rows, R x K accumulators in
// registers over the head dim; per-(row, key) lane partials are then reduced lanewise by
// one ReduceLanesTree per row.
template <KvRows kRows, int R, class D>
SDPA_INLINE void ScoreRows(D d, const FloatRows<const float>& q, const InPlaceRows<kRows>& keys,
                           const FloatRows<float>& scores) {
  using V = hn::Vec<D>;
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(d));
  const float* HWY_RESTRICT q_data = q.data;
  const int64_t q_stride = q.stride, full = keys.full;
  const KvElement<kRows>* const* key_rows = keys.rows;
  const KvElement<kRows>* tails = keys.tails;
  // Eight accumulators: enough independent FMA chains to cover the FMA latency.
  constexpr int64_t K = std::min<int64_t>(N, R == 1 ? 8 : R == 2 ? 4 : 2);
  HWY_ALIGN float partial[R * N * N];  // [row][key][lane]
  for (int64_t k0 = 0; k0 < N; k0 += K) {
    V acc[R][K];
    for (int r = 0; r < R; ++r) {
      for (int64_t k = 0; k < K; ++k) acc[r][k] = hn::Zero(d);
    }
    const auto block = [&](int64_t e, auto key_block) HWY_ATTR {
      for (int64_t k = 0; k < K; ++k) {
        V first, second;
        LoadBlock<kRows>(d, key_block(k0 + k), first, second);
        for (int r = 0; r < R; ++r) {
          acc[r][k] = hn::MulAdd(first, hn::LoadU(d, q_data + r * q_stride + e), acc[r][k]);
          acc[r][k] = hn::MulAdd(second, hn::LoadU(d, q_data + r * q_stride + e + N), acc[r][k]);
        }
      }
    };
    for (int64_t e = 0; e < full; e += 2 * N) {
      block(e, [&](int64_t k) { return key_rows[k] + e; });
    }
    if (tails) block(full, [&](int64_t k) { return tails + k * 2 * N; });
    for (int r = 0; r < R; ++r) {
      for (int64_t k = 0; k < K; ++k) hn::Store(acc[r][k], d, partial + (r * N + k0 + k) * N);
    }
  }
  for (int r = 0; r < R; ++r) {
    V v[N];
    for (int64_t k = 0; k < N; ++k) v[k] = hn::Load(d, partial + (r * N + k) * N);
    hn::StoreU(ReduceLanesTree(d, v, AddLanes()), d, scores.row(r));
  }
}

}  // namespace detail

/// scores.row(r)[k] = q_r . key k for r < q.rows, k < N = Lanes: q rows in the operand
/// layout of kRows (padded with zeros to a whole block past keys.full), keys.rows[k] the N
/// key rows (keys.n = N). Rows go four at a time.
template <KvRows kRows>
SDPA_INLINE void ScoreKeysInPlace(const FloatRows<const float>& q, const InPlaceRows<kRows>& keys,
                                  const FloatRows<float>& scores) {
  const hn::ScalableTag<float> d;
  for (int64_t r0 = 0; r0 < q.rows; r0 += 4) {
    const FloatRows<const float> qr = q.from(r0);
    const FloatRows<float> sr = scores.from(r0);
    switch (std::min<int64_t>(q.rows - r0, 4)) {
      case 1:
        detail::ScoreRows<kRows, 1>(d, qr, keys, sr);
        break;
      case 2:
        detail::ScoreRows<kRows, 2>(d, qr, keys, sr);
        break;
      case 3:
        detail::ScoreRows<kRows, 3>(d, qr, keys, sr);
        break;
      default:
        detail::ScoreRows<kRows, 4>(d, qr, keys, sr);
    }
  }
}

/// acc.row(r)[0, values.cols) (rows in the operand layout of kRows) += sum over
/// k < values.n of p.row(r)[k] * value row k, r < p.rows. Rows go four at a time, their
/// accumulators held in registers over the n keys of each block. Rows [0, ahead.rows.n)
/// of `ahead` (values.cols elements each) are requested into L2 on the way, block by
/// block with the value rows read.
template <KvRows kRows>
SDPA_INLINE void AccumulateValuesInPlace(const FloatRows<const float>& p,
                                         const InPlaceRows<kRows>& values,
                                         const FloatRows<float>& acc, const RowsToRequest& ahead) {
  const hn::ScalableTag<float> d;
  constexpr int64_t B = SplitBlock();
  const int64_t rows = p.rows, n = values.n, full = values.full;
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const FloatRows<const float> pr = p.from(r0);
    const FloatRows<float> ar = acc.from(r0);
    const RowsToRequest request{r0 == 0 ? ahead.rows : RowsAhead{}, ahead.row_stride};
    const auto run = [&](int64_t e, const KvElement<kRows>* t) HWY_ATTR {
      const detail::ValueBlock<kRows> block{values.rows, t, e, n};
      switch (std::min<int64_t>(rows - r0, 4)) {
        case 1:
          return detail::AccumulateBlock<kRows, 1>(d, pr, block, ar, request);
        case 2:
          return detail::AccumulateBlock<kRows, 2>(d, pr, block, ar, request);
        case 3:
          return detail::AccumulateBlock<kRows, 3>(d, pr, block, ar, request);
        default:
          return detail::AccumulateBlock<kRows, 4>(d, pr, block, ar, request);
      }
    };
    for (int64_t e = 0; e < full; e += B) run(e, nullptr);
    if (values.tails) run(full, values.tails);
  }
  // rows past this tile's keys
  PrefetchRows(ahead.rows, ahead.row_stride, values.cols, n, ahead.rows.n);
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_DECODE_ROWS_INL_H_
