// Per-target body of the CPU flash forward: for one (batch, head, q-block), stream the
// key/value tiles with the online softmax of FlashAttention-2 (Dao, 2023). Compiled for
// AVX-512, AVX2 and the portable baseline by Highway's foreach_target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_tile.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/bf16_dot.h"
#include "cpu/flash_tile.h"
#include "cpu/gemm-inl.h"
#include "cpu/pack_bf16.h"
#include "cpu/philox.h"
#include "cpu/target_kernels-inl.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The rows of a q-block in one key tile, and the keys each row sees there.
struct TileRows {
  int64_t q_begin, rows, j0, cols;
  const ColumnRange* keys;     // per row: keys kept (BlockMask rows: their kept hull)
  const bool* blocks_applied;  // per row: FlexRowSupport applied its BlockMask
  const RowSupport* support;   // float32 path: per row, the columns to compute
};

// Scores of tile t (q.k^T, biases, score_mod, masks), then the online softmax: P goes to
// ws.p_bf16 when p_in_bf16, else over ws.scores; alpha gets the accumulator factors.
// Target: the target's traits (TargetKernels).
template <class Target>
void ScoresAndSoftmax(const AttentionParams& p, const DenseMaskRows& dense, FlashScratch& ws,
                      const PackedKv::Tile& t, int64_t b, int64_t h, const TileRows& tr,
                      bool needs_mask, bool p_in_bf16, float* alpha) {
  const int64_t rows = tr.rows, E = p.head_dim_qk;
  const bool alibi = !p.mask.alibi_slopes.empty();
  // Scores still to be multiplied by the scale: the softmax folds it into its exponent.
  float score_scale = 1.0f;
  if (Target::kBf16Dot && ws.bf16_dot) {
    const int64_t e2 = ws.head_dim_qk_pairs2;
    const float scale = static_cast<float>(p.scale);
    Bf16Gemm(rows, kBlockKv, e2 / 2, ws.q_bf16, e2, t.k_pairs, ws.scores, kBlockKv, false);
    if (needs_mask || alibi || !(scale > 0.0f)) {  // masks and biases add to scaled scores
      ScaleRow(ws.scores, rows * kBlockKv, scale);
    } else {
      score_scale = scale;
    }
  } else if (tr.support) {
    GemmRowSupport(rows, kBlockKv, E, ws.q, E, t.k_t, kBlockKv, ws.scores, kBlockKv, *tr.support);
  } else {
    Gemm(rows, kBlockKv, E, ws.q, E, t.k_t, kBlockKv, ws.scores, kBlockKv, false);
  }

  if (alibi) AlibiTile(p, h, tr.q_begin, rows, tr.j0, ws.scores);
  const bool tile_score_mod = needs_mask && ws.flex.score_mod.has_value();
  if (tile_score_mod) {
    ScoreModTile(p, dense, ws.flex, b, h, tr.q_begin, rows, tr.keys, tr.j0, tr.cols, ws.scores,
                 alibi);
  }
  if (needs_mask) {
    for (int64_t r = 0; r < rows; ++r) {
      MaskScoreRow(p, dense, &ws.flex, b, h, tr.q_begin + r, tr.keys[r], tr.j0, tr.cols,
                   ws.scores + r * kBlockKv, nullptr,
                   {tile_score_mod, tr.blocks_applied[r], alibi});
    }
  }
  if constexpr (Target::kBf16Dot) {
    if (p_in_bf16) {
      Target::SoftmaxToBf16(ws.scores, rows, score_scale, ws.row_max, ws.row_sum_partial, alpha,
                            ws.p_bf16);
      return;
    }
  }
  SoftmaxTile(ws.scores, rows, tr.support, score_scale, ws.row_max, ws.row_sum_partial, alpha);
}

// Adds the partial row sums of the last key tiles (kTilesPerPartialSum) into row_sum, and
// with `acc_partial` their partial output rows into acc; zeroes what it added.
HWY_INLINE void AddPartialSums(FlashScratch& ws, int64_t rows, bool acc_partial) {
  if (acc_partial) AddAndZero(ws.acc_partial, ws.acc, rows * ws.head_dim_vo_padded);
  for (int64_t r = 0; r < rows; ++r) {
    ws.row_sum[r] += ws.row_sum_partial[r];
    ws.row_sum_partial[r] = 0.0f;
  }
}

// FlashQBlock's body, on the target's traits (TargetKernels): a template so that the
// branches of kernels the target lacks are discarded, not compiled.
template <class Target>
HWY_INLINE void FlashQBlockWith(const AttentionParams& p, const PackedKv& kv, int64_t b, int64_t h,
                                int64_t q_begin, int64_t generation, FlashScratch& ws,
                                const Tensor& out, const Tensor& lse) {
  const int64_t L = p.q_len, S = p.kv_len, E = p.head_dim_qk;
  const int64_t ev_pad = ws.head_dim_vo_padded;
  const int64_t rows = std::min(kBlockQ, L - q_begin);
  const RowView q_rows(p.q, b, h);
  const DenseMaskRows dense(p.mask, b, h);
  const float scale = static_cast<float>(p.scale);
  const bool alibi = !p.mask.alibi_slopes.empty();  // added per tile by AlibiTile

  const bool bf16 = Target::kBf16Dot && ws.bf16_dot;
  // P goes to bf16 as the softmax computes it, except where dropout needs float32 P.
  const bool p_in_bf16 = bf16 && !p.has_dropout();
  const int64_t e2 = ws.head_dim_qk_pairs2;
  if (bf16) {
    // q as bf16 bits, unscaled (scale multiplies the float32 scores: exact either way for
    // powers of two, one rounding less otherwise).
    pack_bf16_rows(q_rows, q_begin, rows, E, e2, ws.q_bf16);
  } else {
    pack_rows(q_rows, q_begin, rows, E, E, ws.q, scale);
  }
  std::fill(ws.acc, ws.acc + rows * ev_pad, 0.0f);
  std::fill(ws.acc_partial, ws.acc_partial + rows * ev_pad, 0.0f);
  int64_t partial_tiles = 0;  // key tiles summed in acc_partial
  // All kBlockQ entries: SoftmaxTile reads whole vectors of rows.
  std::fill(ws.row_max, ws.row_max + kBlockQ, kNegInf);
  std::fill(ws.row_sum, ws.row_sum + kBlockQ, 0.0f);
  std::fill(ws.row_sum_partial, ws.row_sum_partial + kBlockQ, 0.0f);

  for (int64_t r = 0; r < rows; ++r) {
    ws.row_keys[r] = row_columns(p.mask, b, q_begin + r, L, S);
  }
  // Whether sum_lanes holds row sums not yet in row_sum_partial (fused tiles).
  bool sums_in_lanes = false;
  if constexpr (Target::kFusedTiles) std::fill(ws.sum_lanes, ws.sum_lanes + rows * 16, 0.0f);

  // Key tiles outside every row's band are never visited.
  const KvTileRange tiles = VisibleKvTiles(p, &ws.flex, b, h, q_begin, q_begin + rows);
  for (int64_t j0 = tiles.first; j0 < tiles.end; j0 += kBlockKv) {
    const int64_t cols = std::min(kBlockKv, S - j0);
    const bool needs_mask = TileNeedsMask(p, &ws.flex, ws.row_keys, rows, j0);

    // The rows' keys in this tile; a BlockMask narrows them to its kept keys' hull.
    ColumnRange keys[kBlockQ];
    bool blocks_applied[kBlockQ] = {};
    std::copy(ws.row_keys, ws.row_keys + rows, keys);
    bool any_key = true;
    if (ws.flex.blocks.active()) {
      any_key = false;
      for (int64_t r = 0; r < rows; ++r) {
        blocks_applied[r] = FlexRowSupport(ws.flex, b, h, q_begin + r, j0, cols, keys[r]);
        any_key = any_key || !keys[r].empty();
      }
    }
    if (!any_key) continue;  // nothing kept: the tile changes no row
    const PackedKv::Tile t = kv.tile(p, b, h / p.group_size(), j0 / kBlockKv, generation, ws.row);

    // A tile some row does not fully see is computed only over the rows' supports (the
    // rest is masked to -inf below and contributes exact zeros to P.v).
    int64_t begin[kBlockQ], end[kBlockQ];
    const RowSupport support{begin, end};
    bool trimmed = false;  // some row does not see the whole tile
    if (needs_mask && !bf16) {
      for (int64_t r = 0; r < rows; ++r) {
        begin[r] = std::clamp<int64_t>(keys[r].begin - j0, 0, cols);
        end[r] = std::clamp<int64_t>(keys[r].end - j0, begin[r], cols);
        trimmed = trimmed || begin[r] > 0 || end[r] < cols;
      }
    }
    float alpha[kBlockQ];
    // Nothing changes the scores: q.k^T and the softmax in registers (bf16 needs a
    // positive scale, which its softmax multiplies in; float32 q carries it).
    const bool fused = !needs_mask && !alibi && (!bf16 || (p_in_bf16 && scale > 0.0f));
    if constexpr (Target::kFusedTiles) {
      if (fused) {
        if (bf16) {
          Target::QkSoftmaxBf16(ws.q_bf16, e2, rows, t.k_pairs, e2 / 2, scale, ws.row_max,
                                ws.row_sum_partial, ws.sum_lanes, alpha, ws.p_bf16);
        } else {
          Target::QkSoftmaxF32(ws.q, E, rows, t.k_t, E, ws.row_max, ws.row_sum_partial,
                               ws.sum_lanes, alpha,
                               ws.scores);
        }
        sums_in_lanes = true;
      } else if (sums_in_lanes) {
        Target::FoldLaneSums(rows, ws.sum_lanes, ws.row_sum_partial);
        sums_in_lanes = false;
      }
    }
    if (!(Target::kFusedTiles && fused)) {
      const TileRows tile_rows{
          q_begin, rows, j0, cols, keys, blocks_applied, trimmed ? &support : nullptr};
      ScoresAndSoftmax<Target>(p, dense, ws, t, b, h, tile_rows, needs_mask, p_in_bf16, alpha);
    }
    for (int64_t r = 0; r < rows; ++r) {
      if (alpha[r] != 1.0f) {  // the softmax rescaled row_sum_partial itself
        ScaleRow(ws.acc + r * ev_pad, ev_pad, alpha[r]);
        ScaleRow(ws.acc_partial + r * ev_pad, ev_pad, alpha[r]);
        ws.row_sum[r] *= alpha[r];
      }
      if (p.has_dropout()) {
        const int64_t element = ((b * p.num_heads_q + h) * L + q_begin + r) * S + j0;
        DropoutStream(p.dropout.philox, p.dropout.p)
            .apply(static_cast<uint64_t>(element), ws.scores + r * kBlockKv, cols);
      }
    }

    if (bf16) {
      // P in bf16 for the second product, as FlashAttention does on GPUs.
      for (int64_t r = 0; r < rows && !p_in_bf16; ++r) {
        ConvertRowToBf16(ws.scores + r * kBlockKv, ws.p_bf16 + r * kBlockKv, kBlockKv);
      }
      // Straight into acc: P's bf16 rounding (2^-9) dwarfs the accumulator's, and the
      // partial sums cost the bf16 forward 2%.
      Bf16Gemm(rows, ev_pad, kBlockKv / 2, ws.p_bf16, kBlockKv, t.v_pairs, ws.acc, ev_pad, true);
    } else if (trimmed) {
      GemmAccumulateRowSupport(rows, ev_pad, ws.scores, kBlockKv, t.v, t.v_ld, ws.acc_partial,
                               ev_pad, support);
    } else {
      Gemm(rows, ev_pad, cols, ws.scores, kBlockKv, t.v, t.v_ld, ws.acc_partial, ev_pad, true);
    }
    if (++partial_tiles == kTilesPerPartialSum) {
      AddPartialSums(ws, rows, !bf16);
      partial_tiles = 0;
    }
  }

  if constexpr (Target::kFusedTiles) {
    if (sums_in_lanes) Target::FoldLaneSums(rows, ws.sum_lanes, ws.row_sum_partial);
  }
  AddPartialSums(ws, rows, !bf16);
  const RowView out_rows(out, b, h);
  float* lse_row = lse.data<float>() + (b * p.num_heads_q + h) * L + q_begin;
  for (int64_t r = 0; r < rows; ++r) {
    const float sum = ws.row_sum[r];
    float* acc = ws.acc + r * ev_pad;
    if (!(sum <= 0.0f)) {  // positive, or NaN from a NaN score (the row stays NaN)
      ScaleRow(acc, ev_pad, 1.0f / sum);
      lse_row[r] = ws.row_max[r] + std::log(sum);
    } else {  // fully masked row
      std::fill(acc, acc + ev_pad, 0.0f);
      lse_row[r] = kNegInf;
    }
    out_rows.store(q_begin + r, acc);
  }
}

void FlashQBlock(const AttentionParams& p, const PackedKv& kv, int64_t b, int64_t h,
                 int64_t q_begin, int64_t generation, FlashScratch& ws, const Tensor& out,
                 const Tensor& lse) {
  FlashQBlockWith<TargetKernels>(p, kv, b, h, q_begin, generation, ws, out, lse);
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {

FlashQBlockFn flash_q_block_for(Capability capability) {
  switch (capability) {
#if HWY_TARGETS & HWY_AVX3
    case Capability::kAVX512:
      return &N_AVX3::FlashQBlock;
#endif
#if HWY_TARGETS & HWY_AVX2
    case Capability::kAVX2:
      return &N_AVX2::FlashQBlock;
#endif
    default:
      break;
  }
#if HWY_TARGETS & HWY_EMU128
  return &N_EMU128::FlashQBlock;
#else
  return &N_SCALAR::FlashQBlock;
#endif
}

}  // namespace sdpa::cpu
#endif  // HWY_ONCE
