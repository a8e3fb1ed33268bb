#pragma once
// Packing of q/k/v rows into float32 tiles for the flash kernels' GEMMs, and the packed
// k/v of one (batch, kv head), converted once and shared by every q-block and every query
// head of the GQA group (packing per q-block would cost as much as the q.k^T GEMM).

#include <algorithm>
#include <cstdint>

#include "cpu/flash_tile.h"
#include "cpu/rows.h"

namespace sdpa::cpu {

/// dst[c * ld + e] = rows[first + c][e] * multiplier for c < count, e < dim; columns
/// [dim, ld) are zeroed so padded GEMM lanes read zeros.
inline void pack_rows(const RowView& rows, int64_t first, int64_t count, int64_t dim, int64_t ld,
                      float* dst, float multiplier = 1.0f) {
  for (int64_t c = 0; c < count; ++c) {
    float* row = dst + c * ld;
    rows.load(first + c, row, multiplier);
    std::fill(row + dim, row + ld, 0.0f);
  }
}

/// Transposed pack of a key-like tile: dst[e * kBlockKv + c] = rows[first + c][e] for
/// c < count, zero for count <= c < kBlockKv. `row_tmp` holds one converted row.
inline void pack_transposed(const RowView& rows, int64_t first, int64_t count, int64_t dim,
                            float* dst, float* row_tmp) {
  for (int64_t c = 0; c < count; ++c) {
    rows.load(first + c, row_tmp);
    for (int64_t e = 0; e < dim; ++e) dst[e * kBlockKv + c] = row_tmp[e];
  }
  for (int64_t e = 0; e < dim; ++e) {
    std::fill(dst + e * kBlockKv + count, dst + (e + 1) * kBlockKv, 0.0f);
  }
}

/// k and v of one (batch, kv head) as float32 tiles of kBlockKv keys. Tile t holds
/// k_t [E, kBlockKv] (transposed, for q.k^T) and v [kBlockKv, Ev_pad] (for P.v);
/// padding keys are zero.
class PackedKv {
 public:
  explicit PackedKv(const AttentionParams& p)
      : head_dim_qk_(p.head_dim_qk),
        head_dim_vo_(p.head_dim_vo),
        head_dim_vo_padded_(round_up(std::max<int64_t>(p.head_dim_vo, 1), kMaxLanes)),
        tile_floats_(round_up(head_dim_qk_ * kBlockKv + kBlockKv * head_dim_vo_padded_,
                              kMaxLanes)),
        num_tiles_((p.kv_len + kBlockKv - 1) / kBlockKv),
        buffer_(Tensor::empty({std::max<int64_t>(num_tiles_ * tile_floats_, 1)},
                              DType::kFloat32)) {}

  int64_t num_tiles() const { return num_tiles_; }
  const float* k_t(int64_t tile) const { return base(tile); }
  const float* v(int64_t tile) const { return base(tile) + head_dim_qk_ * kBlockKv; }

  /// Packs tile `tile` of (b, hk); `row_tmp` holds max(E, Ev) floats.
  void pack(const AttentionParams& p, int64_t b, int64_t hk, int64_t tile, float* row_tmp) {
    const int64_t first = tile * kBlockKv;
    const int64_t count = std::min(kBlockKv, p.kv_len - first);
    float* k_t = base(tile);
    float* v = k_t + head_dim_qk_ * kBlockKv;
    pack_transposed(RowView(p.k, b, hk), first, count, head_dim_qk_, k_t, row_tmp);
    pack_rows(RowView(p.v, b, hk), first, count, head_dim_vo_, head_dim_vo_padded_, v);
    std::fill(v + count * head_dim_vo_padded_, v + kBlockKv * head_dim_vo_padded_, 0.0f);
  }

 private:
  float* base(int64_t tile) const { return buffer_.data<float>() + tile * tile_floats_; }
  int64_t head_dim_qk_, head_dim_vo_, head_dim_vo_padded_, tile_floats_, num_tiles_;
  Tensor buffer_;
};

}  // namespace sdpa::cpu
