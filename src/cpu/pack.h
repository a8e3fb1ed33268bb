#pragma once
// Packing of q/k/v rows into float32 tiles for the flash kernels' GEMMs, and the packed
// k/v of one (batch, kv head), converted once and shared by every q-block and every query
// head of the GQA group (packing per q-block would cost as much as the q.k^T GEMM). The
// backward's packing is in pack_backward.h.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "cpu/flash_tile.h"
#include "cpu/matrix_view.h"
#include "cpu/pack_bf16.h"
#include "cpu/kv_rows.h"
#include "cpu/rows.h"
#include "hwy/cache_control.h"

namespace sdpa::cpu {

/// Rows a packing loop requests ahead of the one it reads. The hardware prefetcher, which
/// starts anew on each tile's 16 KB, left packing a key tile (read once by sparse masks)
/// at 5 GB/s where one core streams 30 GB/s.
inline constexpr int64_t kPrefetchRows = 16;

/// Asks for row r's cache lines. On x86 an asm statement: GCC 12 deleted this loop of
/// hwy::Prefetch (__builtin_prefetch) calls as one without side effects.
inline void prefetch_row(const RowView& rows, int64_t r) {
  const char* data = static_cast<const char*>(rows.row_data(r));
  for (int64_t byte = 0; byte < rows.cols() * rows.element_bytes(); byte += 64) {
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(data[byte]));
#else
    hwy::Prefetch(data + byte);
#endif
  }
}

/// dst(c, e) = rows[first + c][e] * multiplier for c < count, e < dim = rows.cols();
/// columns [dim, dst.ld) are zeroed so padded GEMM lanes read zeros.
inline void pack_rows(const RowView& rows, int64_t first, int64_t count, Matrix<float> dst,
                      float multiplier = 1.0f) {
  for (int64_t c = 0; c < count; ++c) {
    float* row = dst.data + c * dst.ld;
    if (c + kPrefetchRows < count) prefetch_row(rows, first + c + kPrefetchRows);
    rows.load(first + c, row, multiplier);
    std::fill(row + rows.cols(), row + dst.ld, 0.0f);
  }
}

// pack_transposed for float32 rows with unit column stride: blocks of 16 keys x 16 dims
// as one 16 x 16 transpose of 32-bit words in registers. The scalar scatter (one store
// per element, each to another cache line) took 10% of sparse masks' forward time, where
// each key tile serves only a few q-blocks.
__attribute__((target("avx512f"))) inline void PackTransposedF32Avx512(const RowView& rows,
                                                                       int64_t first,
                                                                       int64_t count,
                                                                       float* dst) {
  const int64_t dim = rows.cols();
  for (int64_t c0 = 0; c0 < count; c0 += 16) {
    for (int64_t i = c0 + 16; i < std::min(count, c0 + 16 + kPrefetchRows); ++i) {
      prefetch_row(rows, first + i);
    }
    for (int64_t e0 = 0; e0 < dim; e0 += 16) {
      const __mmask16 lanes =
          static_cast<__mmask16>(dim - e0 >= 16 ? 0xFFFF : (1u << (dim - e0)) - 1);
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        r[i] = c0 + i < count
                   ? _mm512_maskz_loadu_epi32(
                         lanes, static_cast<const float*>(rows.row_data(first + c0 + i)) + e0)
                   : _mm512_setzero_si512();
      }
      Transpose16x16Words(r);
      // Keys past count were loaded as zeros: their lanes store the padding.
      for (int64_t k = 0; k < std::min<int64_t>(16, dim - e0); ++k) {
        _mm512_storeu_si512(dst + (e0 + k) * kBlockKv + c0, r[k]);
      }
    }
  }
}

/// Transposed pack of a key-like tile: dst[e * kBlockKv + c] = rows[first + c][e] for
/// c < count, e < dim = rows.cols(); zero for count <= c < kBlockKv. `row_tmp` holds one
/// converted row.
inline void pack_transposed(const RowView& rows, int64_t first, int64_t count, float* dst,
                            float* row_tmp) {
  const int64_t dim = rows.cols();
  if (rows.dtype() == DType::kFloat32 && rows.col_stride() == 1 &&
      __builtin_cpu_supports("avx512f")) {
    PackTransposedF32Avx512(rows, first, count, dst);
  } else {
    for (int64_t c = 0; c < count; ++c) {
      rows.load(first + c, row_tmp);
      for (int64_t e = 0; e < dim; ++e) dst[e * kBlockKv + c] = row_tmp[e];
    }
  }
  for (int64_t e = 0; e < dim; ++e) {
    std::fill(dst + e * kBlockKv + count, dst + (e + 1) * kBlockKv, 0.0f);
  }
}

/// k and v of a (batch, kv head) as float32 tiles of kBlockKv keys, packed on first use:
/// tile t holds k_t [E, kBlockKv] (transposed, for q.k^T) and, unless v is read in place,
/// v [kBlockKv, Ev_pad] (for P.v); padding keys are zero. Packing on first use (instead of
/// all tiles up front) skips tiles no q-block visits (windows, documents, padding,
/// BlockMask), packs each tile just before its first GEMM while it is hot in cache, and
/// needs no barrier between packing and computing. float32 v with unit column stride and
/// Ev a multiple of kMaxLanes is read in place (it already has the GEMM's layout).
/// Two slots hold consecutive (batch, kv head)s, so threads finishing one may start on the
/// next without a barrier between them (flash_forward).
class PackedKv {
 public:
  /// One key tile's operands for the GEMMs (float32, or bf16 pairs in bf16 mode).
  struct Tile {
    const float* k_t;  ///< [E, kBlockKv]
    const float* v;    ///< [kBlockKv, Ev_pad] rows, `v_ld` floats apart
    int64_t v_ld;
    const uint16_t* k_pairs;  ///< bf16 mode: [E2 / 2][kBlockKv][2] (bf16_dot.h layout)
    const uint16_t* v_pairs;  ///< bf16 mode: [kBlockKv / 2][Ev_pad][2]
  };

  /// `bf16_pairs`: pack bfloat16 k and v as vdpbf16ps pairs (uses_bf16_dot) instead of
  /// float32.
  PackedKv(const AttentionParams& p, bool bf16_pairs)
      : kv_len_(p.kv_len),
        head_dim_qk_(p.head_dim_qk),
        head_dim_vo_padded_(round_up(std::max<int64_t>(p.head_dim_vo, 1), kMaxLanes)),
        bf16_pairs_(bf16_pairs),
        // A tile's value rows read in place need one stride between them: not across pages.
        v_in_place_(!bf16_pairs && p.v.dtype() == DType::kFloat32 && p.v.stride(3) == 1 &&
                    head_dim_vo_padded_ == p.head_dim_vo && !p.kv_pages),
        tile_floats_(bf16_pairs ? round_up((round_up(head_dim_qk_, 2) + head_dim_vo_padded_) *
                                               kBlockKv / 2,
                                           kMaxLanes)
                                : round_up(head_dim_qk_ * kBlockKv +
                                               (v_in_place_ ? 0 : kBlockKv * head_dim_vo_padded_),
                                           kMaxLanes)),
        num_tiles_((p.kv_len + kBlockKv - 1) / kBlockKv),
        buffer_(Tensor::empty({std::max<int64_t>(kSlots * num_tiles_ * tile_floats_, 1)},
                              DType::kFloat32)),
        claimed_(static_cast<size_t>(kSlots * num_tiles_)),
        ready_(static_cast<size_t>(kSlots * num_tiles_)) {}

  /// How many (batch, kv head)s may be in flight at once: generations g and g + 1.
  static constexpr int64_t kSlots = 2;

  int64_t num_tiles() const { return num_tiles_; }

  /// Tile `tile` of (b, hk), packing it first when no thread has yet for this (b, hk).
  /// (b, hk) is generation g = b * Hkv + hk + 1, which picks its slot: the caller must not
  /// start generation g + kSlots while any thread still reads tiles of g. Safe to call
  /// from several threads: one packs, the others wait for it. `row_tmp` holds max(E, Ev)
  /// floats.
  Tile tile(const AttentionParams& p, int64_t b, int64_t hk, int64_t tile, float* row_tmp) const {
    // From 1: the counters below start at 0, "no generation".
    const int64_t generation = b * p.num_heads_kv + hk + 1;
    const int64_t slot_tile = generation % kSlots * num_tiles_ + tile;
    std::atomic<int64_t>& ready = ready_[static_cast<size_t>(slot_tile)];
    std::atomic<int64_t>& claimed = claimed_[static_cast<size_t>(slot_tile)];
    if (ready.load(std::memory_order_acquire) != generation) {
      int64_t seen = claimed.load(std::memory_order_relaxed);
      if (seen != generation && claimed.compare_exchange_strong(seen, generation)) {
        pack(key_rows(p, b, hk), value_rows(p, b, hk), tile, base(slot_tile), row_tmp);
        ready.store(generation, std::memory_order_release);
      } else {
        while (ready.load(std::memory_order_acquire) != generation) std::this_thread::yield();
      }
    }
    float* k_t = base(slot_tile);
    if (bf16_pairs_) {
      const uint16_t* k_pairs = reinterpret_cast<const uint16_t*>(k_t);
      return {nullptr, nullptr, 0, k_pairs, k_pairs + round_up(head_dim_qk_, 2) * kBlockKv};
    }
    if (!v_in_place_) {
      return {k_t, k_t + head_dim_qk_ * kBlockKv, head_dim_vo_padded_, nullptr, nullptr};
    }
    const float* v = p.v.data<float>() + b * p.v.stride(0) + hk * p.v.stride(1) +
                     tile * kBlockKv * p.v.stride(2);
    return {k_t, v, p.v.stride(2), nullptr, nullptr};
  }

 private:
  // Packs key tile `tile` of the kv head whose rows are k and v. Reads only the call's
  // inputs and writes only this tile's slot, so it cannot fail.
  void pack(const RowView& k, const RowView& v, int64_t tile, float* k_t, float* row_tmp) const {
    const int64_t first = tile * kBlockKv;
    const int64_t count = std::min(kBlockKv, kv_len_ - first);
    if (bf16_pairs_) return pack_pairs(k, v, first, count, reinterpret_cast<uint16_t*>(k_t));
    pack_transposed(k, first, count, k_t, row_tmp);
    if (v_in_place_) return;
    float* v_tile = k_t + head_dim_qk_ * kBlockKv;
    pack_rows(v, first, count, {v_tile, head_dim_vo_padded_});
    std::fill(v_tile + count * head_dim_vo_padded_, v_tile + kBlockKv * head_dim_vo_padded_,
              0.0f);
  }

  // bf16 bits of k and v rows [first, first + count) as vdpbf16ps pairs (bf16_dot.h):
  // k pairs over the head dim, v pairs over the keys; padding keys are zero.
  void pack_pairs(const RowView& k, const RowView& v, int64_t first, int64_t count,
                  uint16_t* k_pairs) const {
    const int64_t ev = head_dim_vo_padded_;
    uint16_t* v_pairs = k_pairs + round_up(head_dim_qk_, 2) * kBlockKv;
    pack_bf16_dim_pairs(k, first, count, kBlockKv, k_pairs);
    pack_bf16_row_pairs(v, first, count, ev, v_pairs);
    const int64_t packed = count + count % 2;
    std::fill(v_pairs + packed * ev, v_pairs + kBlockKv * ev, uint16_t{0});
  }

  float* base(int64_t slot_tile) const {
    return buffer_.data<float>() + slot_tile * tile_floats_;
  }
  int64_t kv_len_, head_dim_qk_, head_dim_vo_padded_;
  bool bf16_pairs_;
  bool v_in_place_;
  int64_t tile_floats_, num_tiles_;
  Tensor buffer_;
  // Per slot and tile: the generation that claimed packing it and the one whose packing
  // finished.
  mutable std::vector<std::atomic<int64_t>> claimed_, ready_;
};

}  // namespace sdpa::cpu
