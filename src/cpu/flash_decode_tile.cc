// Per-target body of the split-KV decode path (flash_decode.h): every query row of a kv
// head's GQA group over one chunk of keys, scores as dot products of unpacked key rows,
// the online softmax of FlashAttention-2 and P.v as row updates. Compiled for AVX-512,
// AVX2 and the portable baseline by Highway's foreach_target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_decode_tile.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstring>

#include "cpu/flash_decode.h"
#include "cpu/philox.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

namespace {

// dst[0, padded) = row r of `rows` as float32 (times `multiplier`), zero beyond cols().
// float32 and bfloat16 rows with unit stride convert with vectors: the decode path reads
// every key and value exactly once, so this conversion is its main work besides memory.
HWY_INLINE void LoadRow(const RowView& rows, int64_t r, int64_t padded, float* HWY_RESTRICT dst,
                        float multiplier = 1.0f) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t n = rows.cols();
  const int64_t full = n / lanes * lanes;
  const auto m = hn::Set(d, multiplier);
  if (rows.col_stride() == 1 && rows.dtype() == DType::kFloat32) {
    const float* src = static_cast<const float*>(rows.row_data(r));
    for (int64_t e = 0; e < full; e += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, src + e), m), d, dst + e);
    for (int64_t e = full; e < n; ++e) dst[e] = src[e] * multiplier;
  } else if (rows.col_stride() == 1 && rows.dtype() == DType::kBFloat16) {
    // bfloat16 is the upper half of a float32: widen the bits and shift them up.
    const hn::RebindToUnsigned<decltype(d)> du32;
    const hn::Rebind<uint16_t, decltype(d)> du16;
    const uint16_t* src = static_cast<const uint16_t*>(rows.row_data(r));
    for (int64_t e = 0; e < full; e += lanes) {
      const auto bits = hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, src + e)));
      hn::StoreU(hn::Mul(hn::BitCast(d, bits), m), d, dst + e);
    }
    for (int64_t e = full; e < n; ++e) {
      const uint32_t bits = static_cast<uint32_t>(src[e]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      dst[e] = f * multiplier;
    }
  } else {
    rows.load(r, dst, multiplier);
  }
  std::fill(dst + n, dst + padded, 0.0f);
}

// Rows are read once, one after another, each a few hundred bytes: requesting the row
// kPrefetchRows ahead keeps enough misses in flight to stream at memory bandwidth.
constexpr int64_t kPrefetchRows = 24;

HWY_INLINE void Prefetch(const RowView& rows, int64_t r) {
  const char* row = static_cast<const char*>(rows.row_data(r));
  const int64_t bytes = rows.cols() * rows.col_stride() * static_cast<int64_t>(element_size(rows.dtype()));
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(row + offset);
}

HWY_INLINE float Dot(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t padded) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);  // two chains hide the FMA latency
  int64_t e = 0;
  for (; e + 2 * lanes <= padded; e += 2 * lanes) {
    sum0 = hn::MulAdd(hn::LoadU(d, a + e), hn::LoadU(d, b + e), sum0);
    sum1 = hn::MulAdd(hn::LoadU(d, a + e + lanes), hn::LoadU(d, b + e + lanes), sum1);
  }
  for (; e < padded; e += lanes) sum0 = hn::MulAdd(hn::LoadU(d, a + e), hn::LoadU(d, b + e), sum0);
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
}

// acc[0, padded) += weight * row[0, padded).
HWY_INLINE void Axpy(float weight, const float* HWY_RESTRICT row, float* HWY_RESTRICT acc,
                     int64_t padded) {
  const hn::ScalableTag<float> d;
  const auto w = hn::Set(d, weight);
  for (int64_t e = 0; e < padded; e += static_cast<int64_t>(hn::Lanes(d))) {
    hn::StoreU(hn::MulAdd(w, hn::LoadU(d, row + e), hn::LoadU(d, acc + e)), d, acc + e);
  }
}

}  // namespace

void DecodeChunk(const AttentionParams& p, int64_t b, int64_t hk, int64_t kv_begin,
                 int64_t kv_end, DecodeScratch& ws, float* acc, float* row_max, float* row_sum) {
  const int64_t L = p.q_len, S = p.kv_len, G = p.group_size(), rows = G * L;
  const int64_t e_pad = ws.head_dim_qk_padded, ev_pad = ws.head_dim_vo_padded;
  const float scale = static_cast<float>(p.scale);
  const RowView k_rows(p.k, b, hk), v_rows(p.v, b, hk);

  ColumnRange visible{kv_end, kv_begin};  // union of the rows' keys within the chunk
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t h = hk * G + r / L, i = r % L;
    LoadRow(RowView(p.q, b, h), i, e_pad, ws.q + r * e_pad, scale);
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

  for (int64_t j0 = visible.begin / kBlockKv * kBlockKv; j0 < visible.end; j0 += kBlockKv) {
    const int64_t cols = std::min(kBlockKv, S - j0);
    const int64_t c_begin = std::max<int64_t>(visible.begin - j0, 0);
    const int64_t c_end = std::min(cols, visible.end - j0);
    for (int64_t c = c_begin; c < c_end; ++c) {
      Prefetch(k_rows, std::min(j0 + c + kPrefetchRows, S - 1));
      LoadRow(k_rows, j0 + c, e_pad, ws.key);
      for (int64_t r = 0; r < rows; ++r) {
        ws.scores[r * kBlockKv + c] = Dot(ws.q + r * e_pad, ws.key, e_pad);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = hk * G + r / L, i = r % L;
      float* s = ws.scores + r * kBlockKv;
      // Columns outside [c_begin, c_end) are outside every row's keys: MaskScoreRow sets
      // them (and every other masked key) to -inf.
      MaskScoreRow(p, DenseMaskRows(p.mask, b, h), &ws.flex, b, h, i, ws.row_keys[r], j0, cols, s);
      const float alpha = SoftmaxRowUpdate(s, 0, kBlockKv, row_max[r], row_sum[r]);
      if (alpha != 1.0f) ScaleRow(acc + r * ev_pad, ev_pad, alpha);
      if (p.has_dropout()) {
        const int64_t element = ((b * p.num_heads_q + h) * L + i) * S + j0;
        DropoutStream(p.dropout.philox, p.dropout.p).apply(static_cast<uint64_t>(element), s, cols);
      }
    }
    for (int64_t c = c_begin; c < c_end; ++c) {
      Prefetch(v_rows, std::min(j0 + c + kPrefetchRows, S - 1));
      LoadRow(v_rows, j0 + c, ev_pad, ws.value);
      for (int64_t r = 0; r < rows; ++r) {
        const float weight = ws.scores[r * kBlockKv + c];
        if (weight != 0.0f) Axpy(weight, ws.value, acc + r * ev_pad, ev_pad);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {

DecodeChunkFn decode_chunk_for(Capability capability) {
  switch (capability) {
#if HWY_TARGETS & HWY_AVX3
    case Capability::kAVX512: return &N_AVX3::DecodeChunk;
#endif
#if HWY_TARGETS & HWY_AVX2
    case Capability::kAVX2: return &N_AVX2::DecodeChunk;
#endif
    default: break;
  }
#if HWY_TARGETS & HWY_EMU128
  return &N_EMU128::DecodeChunk;
#else
  return &N_SCALAR::DecodeChunk;
#endif
}

}  // namespace sdpa::cpu
#endif  // HWY_ONCE
