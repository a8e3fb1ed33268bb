#pragma once
// The flash backward's packed copy of one (batch, kv head) group: converted once, read by
// every (q block, key tile) pair of both passes (packing inside them would repeat the
// conversion L / kBlockQ or S / kBlockKv times).

#include <algorithm>
#include <cstdint>

#include "cpu/flash_tile.h"
#include "cpu/pack.h"
#include "cpu/pack_bf16.h"
#include "cpu/rows.h"

namespace sdpa::cpu {

/// Everything the backward reads of one (batch, kv head) group (E_pad, Ev_pad: head dims
/// rounded up to kMaxLanes; E2, Ev2: rounded up to 2; L2: q_len rounded up to 2).
///
/// float32 mode, per key tile: k_t [E, kBlockKv], k [kBlockKv, E_pad], v_t [Ev, kBlockKv];
/// per query head of the group: q * scale [L, E_pad] and dO [L, Ev_pad].
///
/// bf16 mode (`bf16`: uses_bf16_dot, decided on the calling thread since the capability
/// override is per thread), bf16 bits in
/// bf16_dot.h's layouts, per key tile: k and v as pairs over the head dim
/// [E2 / 2][kBlockKv][2], [Ev2 / 2][kBlockKv][2] (S = q k^T, dP = dO v^T) and k as pairs
/// over the keys [kBlockKv / 2][E_pad][2] (dQ = dS k); per query head: q [L, E2] and
/// dO [L, Ev2] rows, unscaled (S and dP), and both as pairs over the rows
/// [L2 / 2][E_pad][2], [L2 / 2][Ev_pad][2] (dK = dS^T q, dV = P^T dO).
class PackedBackwardGroup {
 public:
  PackedBackwardGroup(const AttentionParams& p, bool bf16)
      : bf16_(bf16),
        q_len_(p.q_len),
        e_(p.head_dim_qk),
        e_pad_(round_up(p.head_dim_qk, kMaxLanes)),
        ev_pad_(round_up(std::max<int64_t>(p.head_dim_vo, 1), kMaxLanes)),
        e2_(round_up(p.head_dim_qk, 2)),
        ev2_(round_up(p.head_dim_vo, 2)),
        tile_floats_(tile_floats(p, bf16_)),
        head_floats_(head_floats(p, bf16_)),
        num_tiles_((p.kv_len + kBlockKv - 1) / kBlockKv),
        kv_(Tensor::empty({std::max<int64_t>(num_tiles_ * tile_floats_, 1)}, DType::kFloat32)),
        q_(Tensor::empty({std::max<int64_t>(p.group_size() * head_floats_, 1)},
                         DType::kFloat32)) {}

  /// Bytes one group of `p` takes.
  static int64_t bytes(const AttentionParams& p, bool bf16) {
    const int64_t tiles = (p.kv_len + kBlockKv - 1) / kBlockKv;
    return 4 * (tiles * tile_floats(p, bf16) + p.group_size() * head_floats(p, bf16));
  }

  bool bf16() const { return bf16_; }
  int64_t num_tiles() const { return num_tiles_; }
  int64_t e_pad() const { return e_pad_; }
  int64_t ev_pad() const { return ev_pad_; }
  int64_t e2() const { return e2_; }
  int64_t ev2() const { return ev2_; }

  // float32 mode. Rows are those of query head `g` of the group (g < group_size).
  const float* k_t(int64_t tile) const { return kv_base(tile); }
  const float* k(int64_t tile) const { return kv_base(tile) + e_ * kBlockKv; }
  const float* v_t(int64_t tile) const {
    return kv_base(tile) + e_ * kBlockKv + kBlockKv * e_pad_;
  }
  const float* q(int64_t g, int64_t row) const { return q_base(g) + row * e_pad_; }
  const float* dout(int64_t g, int64_t row) const {
    return q_base(g) + q_len_ * e_pad_ + row * ev_pad_;
  }

  // bf16 mode; `row` of the pairs over rows must be even (a q block's first row).
  const uint16_t* k_dim_pairs(int64_t tile) const { return kv_bits(tile); }
  const uint16_t* v_dim_pairs(int64_t tile) const { return kv_bits(tile) + e2_ * kBlockKv; }
  const uint16_t* k_key_pairs(int64_t tile) const {
    return kv_bits(tile) + (e2_ + ev2_) * kBlockKv;
  }
  const uint16_t* q_bf16(int64_t g, int64_t row) const { return q_bits(g) + row * e2_; }
  const uint16_t* dout_bf16(int64_t g, int64_t row) const {
    return q_bits(g) + q_len_ * e2_ + row * ev2_;
  }
  const uint16_t* q_row_pairs(int64_t g, int64_t row) const {
    return q_bits(g) + q_len_ * (e2_ + ev2_) + row * e_pad_;
  }
  const uint16_t* dout_row_pairs(int64_t g, int64_t row) const {
    return q_bits(g) + q_len_ * (e2_ + ev2_) + round_up(q_len_, 2) * e_pad_ + row * ev_pad_;
  }

  /// Packs key tile `tile` of (b, hk); `row_tmp` holds max(E, Ev) floats.
  void pack_kv(const AttentionParams& p, int64_t b, int64_t hk, int64_t tile, float* row_tmp) {
    const int64_t first = tile * kBlockKv, count = std::min(kBlockKv, p.kv_len - first);
    const RowView k_rows(p.k, b, hk), v_rows(p.v, b, hk);
    if (bf16_) {
      pack_bf16_dim_pairs(k_rows, first, count, kBlockKv, mutable_bits(k_dim_pairs(tile)));
      pack_bf16_dim_pairs(v_rows, first, count, kBlockKv, mutable_bits(v_dim_pairs(tile)));
      uint16_t* k_pairs = mutable_bits(k_key_pairs(tile));
      pack_bf16_row_pairs(k_rows, first, count, e_pad_, k_pairs);
      std::fill(k_pairs + (count + count % 2) * e_pad_, k_pairs + kBlockKv * e_pad_,
                uint16_t{0});
      return;
    }
    float* k_t = kv_base(tile);
    float* k = k_t + e_ * kBlockKv;
    float* v_t = k + kBlockKv * e_pad_;
    pack_transposed(k_rows, first, count, k_t, row_tmp);
    pack_rows(k_rows, first, count, {k, e_pad_});
    std::fill(k + count * e_pad_, k + kBlockKv * e_pad_, 0.0f);
    pack_transposed(v_rows, first, count, v_t, row_tmp);
  }

  /// Packs rows [q_begin, q_begin + kBlockQ) of query head g of (b, hk)'s group.
  void pack_q(const AttentionParams& p, int64_t b, int64_t hk, int64_t g, int64_t q_begin) {
    const int64_t h = hk * p.group_size() + g, count = std::min(kBlockQ, p.q_len - q_begin);
    const RowView q_rows(p.q, b, h), dout_rows(p.grad_out, b, h);
    if (bf16_) {
      pack_bf16_rows(q_rows, q_begin, count, {mutable_bits(q_bf16(g, q_begin)), e2_});
      pack_bf16_rows(dout_rows, q_begin, count, {mutable_bits(dout_bf16(g, q_begin)), ev2_});
      pack_bf16_row_pairs(q_rows, q_begin, count, e_pad_, mutable_bits(q_row_pairs(g, q_begin)));
      pack_bf16_row_pairs(dout_rows, q_begin, count, ev_pad_,
                          mutable_bits(dout_row_pairs(g, q_begin)));
      return;
    }
    pack_rows(q_rows, q_begin, count, {q_base(g) + q_begin * e_pad_, e_pad_},
              static_cast<float>(p.scale));
    pack_rows(dout_rows, q_begin, count,
              {q_base(g) + q_len_ * e_pad_ + q_begin * ev_pad_, ev_pad_});
  }

 private:
  static int64_t tile_floats(const AttentionParams& p, bool bf16) {
    const int64_t e = p.head_dim_qk, ev = p.head_dim_vo, e_pad = round_up(e, kMaxLanes);
    if (bf16) {
      return round_up((round_up(e, 2) + round_up(ev, 2) + e_pad) * kBlockKv / 2, kMaxLanes);
    }
    return round_up((e + ev) * kBlockKv + kBlockKv * e_pad, kMaxLanes);
  }
  static int64_t head_floats(const AttentionParams& p, bool bf16) {
    const int64_t e_pad = round_up(p.head_dim_qk, kMaxLanes);
    const int64_t ev_pad = round_up(std::max<int64_t>(p.head_dim_vo, 1), kMaxLanes);
    if (!bf16) return round_up(p.q_len * (e_pad + ev_pad), kMaxLanes);
    const int64_t rows_bits =
        p.q_len * (round_up(p.head_dim_qk, 2) + round_up(p.head_dim_vo, 2));
    return round_up((rows_bits + round_up(p.q_len, 2) * (e_pad + ev_pad) + 1) / 2, kMaxLanes);
  }
  float* kv_base(int64_t tile) const { return kv_.data<float>() + tile * tile_floats_; }
  float* q_base(int64_t g) const { return q_.data<float>() + g * head_floats_; }
  const uint16_t* kv_bits(int64_t tile) const {
    return reinterpret_cast<const uint16_t*>(kv_base(tile));
  }
  const uint16_t* q_bits(int64_t g) const { return reinterpret_cast<const uint16_t*>(q_base(g)); }
  // The buffers are this object's own; the accessors above hand them out read-only.
  static uint16_t* mutable_bits(const uint16_t* p) { return const_cast<uint16_t*>(p); }

  bool bf16_;
  int64_t q_len_, e_, e_pad_, ev_pad_, e2_, ev2_, tile_floats_, head_floats_, num_tiles_;
  Tensor kv_, q_;
};

}  // namespace sdpa::cpu
