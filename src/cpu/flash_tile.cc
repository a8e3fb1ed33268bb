// Per-target body of the CPU flash forward: for one (batch, head, q-block), stream the
// key/value tiles with the online softmax of FlashAttention-2 (Dao, 2023). Compiled for
// AVX-512, AVX2 and the portable baseline by Highway's foreach_target.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_tile.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/kernel_inline.h"
#include "cpu/bf16_dot.h"
#include "cpu/flash_tile.h"
#include "cpu/gemm-inl.h"
#include "cpu/kernel_context.h"
#include "cpu/pack_bf16.h"
#include "cpu/target_kernels-inl.h"
#include "cpu/tile_ops-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The rows of a q-block in one key tile [j0, j0 + cols), and how the tile is computed.
struct TileRows {
  QueryTile q;
  int64_t j0, cols;
  const HeadMasking* masking;
  const ColumnRange* keys;     // per row: keys kept (BlockMask rows: their kept hull)
  const bool* blocks_applied;  // per row: FlexRowSupport applied its BlockMask
  const RowSupport* support;   // float32 path: per row, the columns to compute
  bool needs_mask;             // TileNeedsMask
  bool p_in_bf16;              // P goes to ws.p_bf16 as the softmax computes it
  float max_slack;             // RaiseRowMaxes' slack for that softmax (grouped P.v)
};

// Scores of tile t (q.k^T, biases, score_mod, masks), then the online softmax of
// ws.partial: P goes to ws.p_bf16 when p_in_bf16, else over ws.scores. Target: the
// target's traits (TargetKernels); with fused tiles, a float32 tile takes their lazy
// softmax (its row sums then wait in ws.partial.l_lanes).
template <class Target>
void ScoresAndSoftmax(const ForwardCall& call, const TileRows& tr, const PackedKv::Tile& t,
                      FlashScratch& ws) {
  const AttentionParams& p = call.p;
  const int64_t rows = tr.q.rows, E = p.head_dim_qk;
  const bool alibi = !p.mask.alibi_slopes.empty();
  // Scores still to be multiplied by the scale: the softmax folds it into its exponent.
  float score_scale = 1.0f;
  if (Target::kBf16Dot && ws.bf16_dot) {
    const int64_t e2 = ws.head_dim_qk_pairs2;
    Bf16GemmOn(ws.amx.active(), {rows, kBlockKv, e2 / 2}, {ws.q_bf16, e2}, t.k_pairs,
               {ws.scores, kBlockKv}, GemmOutput::kOverwrite);
    if (tr.needs_mask || alibi || !(call.scale > 0.0f)) {  // masks and biases add to scaled scores
      ScaleRow(ws.scores, rows * kBlockKv, call.scale);
    } else {
      score_scale = call.scale;
    }
  } else if (tr.support) {
    GemmRowSupport({rows, kBlockKv, E}, {ws.q, E}, {t.k_t, kBlockKv}, {ws.scores, kBlockKv},
                   *tr.support);
  } else {
    Gemm({rows, kBlockKv, E}, {ws.q, E}, {t.k_t, kBlockKv}, {ws.scores, kBlockKv},
         GemmOutput::kOverwrite);
  }

  const KeyTileRows tile{tr.q.q_begin, rows, tr.keys, tr.j0, tr.cols};
  if (alibi) AlibiTile(*tr.masking, tile, ws.scores);
  const bool tile_score_mod = tr.needs_mask && ws.flex.score_mod.has_value();
  if (tile_score_mod) ScoreModTile(*tr.masking, tile, ws.scores, alibi);
  if (tr.needs_mask) {
    for (int64_t r = 0; r < rows; ++r) {
      MaskScoreRow(*tr.masking, tile.row(r), ws.scores + r * kBlockKv, nullptr,
                   {tile_score_mod, tr.blocks_applied[r], alibi});
    }
  }
  const ScoreRows scores{ws.scores, rows, score_scale};
  if constexpr (Target::kBf16Dot) {
    if (tr.p_in_bf16) return Target::SoftmaxToBf16(scores, ws.partial, ws.p_bf16, tr.max_slack);
  }
  if constexpr (Target::kFusedTiles) {
    if (!ws.bf16_dot) return Target::SoftmaxLazyF32(scores, ws.partial);
  }
  SoftmaxTile(scores, tr.support, ws.partial);
}

// The keys of a q-block's rows in one key tile: keys[r] is row r's row_columns, narrowed
// by a BlockMask to its kept keys' hull (blocks_applied[r]: FlexRowSupport narrowed it).
struct TileKeySet {
  ColumnRange keys[kBlockQ];
  bool blocks_applied[kBlockQ];
};

// Fills `set` for the rows and key tile of `tile` (whose keys it ignores; the rows' keys
// are ws.row_keys); returns whether any row keeps a key there.
SDPA_INLINE bool TileKeys(const HeadMasking& m, const FlashScratch& ws, const KeyTileRows& tile,
                          TileKeySet& set) {
  std::copy(ws.row_keys, ws.row_keys + tile.rows, set.keys);
  std::fill(set.blocks_applied, set.blocks_applied + tile.rows, false);
  if (!ws.flex.blocks.active()) return true;
  bool any_key = false;
  if (FlexTileSupport(m, {tile.q_begin, tile.rows, set.keys, tile.j0, tile.cols}, set.keys,
                      set.blocks_applied, any_key)) {
    return any_key;
  }
  for (int64_t r = 0; r < tile.rows; ++r) {
    KeyTileRow row{tile.q_begin + r, set.keys[r], tile.j0, tile.cols};
    set.blocks_applied[r] = FlexRowSupport(m, row);
    set.keys[r] = row.keep;
    any_key = any_key || !row.keep.empty();
  }
  return any_key;
}

// Whether key tile j0 of a flex call (which TileNeedsMask always sends to the masked path)
// needs nothing per element, so that the fused kernel can take it: no dense mask, a whole
// tile that every row keeps entirely (band, and the BlockMask's exact kept keys from
// TileKeys), and a score_mod, if any, that runs on the fused float32 kernel's registers.
// Interior tiles of documents, windows and causal BlockMasks, and every whole tile of a
// soft-capping or ALiBi score_mod, then cost what plain attention's do. A native ALiBi
// bias is added to the scores before the score_mod, which the fused kernel cannot do:
// such tiles take the masked path, where ScoresAndSoftmax applies both in that order.
SDPA_INLINE bool FlexTileInRegisters(const AttentionParams& p, FlashScratch& ws,
                                     const TileKeySet& set, int64_t rows, int64_t j0, bool bf16) {
  if (!ws.flex.active() || p.mask.dense_kind != DenseMaskKind::kNone ||
      !p.mask.alibi_slopes.empty() || j0 + kBlockKv > p.kv_len) {
    return false;
  }
  if (ws.flex.score_mod &&
      (bf16 || !flex::HWY_NAMESPACE::ScoreModRunsInRegisters(*ws.flex.score_mod))) {
    return false;
  }
  const bool blocks = ws.flex.blocks.active();
  for (int64_t r = 0; r < rows; ++r) {
    const ColumnRange& keys = set.keys[r];
    if (keys.begin > j0 || keys.end < j0 + kBlockKv || (blocks && !set.blocks_applied[r])) {
      return false;
    }
  }
  return true;
}

// Whether a float32 tile that needs masking is masked by its rows' key intervals alone,
// so that the fused kernel can mask it in registers (BandRows): no dense mask, no ALiBi,
// no score_mod, and BlockMask rows (if any) whose kept keys are exactly their hull.
SDPA_INLINE bool BandTileInRegisters(const AttentionParams& p, const FlashScratch& ws,
                                     const TileKeySet& set, int64_t rows) {
  if (p.mask.dense_kind != DenseMaskKind::kNone || !p.mask.alibi_slopes.empty() ||
      ws.flex.score_mod) {
    return false;
  }
  if (!ws.flex.blocks.active()) return true;
  return std::all_of(set.blocks_applied, set.blocks_applied + rows, [](bool b) { return b; });
}

// P.v of the key tiles waiting in ws.p_group (kPvGroup), added to total.o as one GEMM.
SDPA_INLINE void FlushGroupPv(FlashScratch& ws, int64_t rows) {
  if (ws.pending_tiles == 0) return;
  AmxBf16GemmGroups({rows, ws.head_dim_vo_padded, ws.pending_tiles * kBlockKv / 2},
                    {ws.p_group, kPvGroup * kBlockKv}, ws.v_group, kBlockKv / 2,
                    {ws.total.o, ws.head_dim_vo_padded}, GemmOutput::kAccumulate);
  ws.pending_tiles = 0;
}

// Puts the key tile's P (ws.p_bf16) and value pairs into the waiting group, running the
// group's P.v when it is full.
SDPA_INLINE void GroupPv(FlashScratch& ws, int64_t rows, const uint16_t* v_pairs) {
  uint16_t* slot = ws.p_group + ws.pending_tiles * kBlockKv;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(ws.p_bf16 + r * kBlockKv, kBlockKv, slot + r * kPvGroup * kBlockKv);
  }
  ws.v_group[ws.pending_tiles++] = v_pairs;
  if (ws.pending_tiles == kPvGroup) FlushGroupPv(ws, rows);
}

// Starts a q-block: q packed (float32 times the scale, or bf16 bits unscaled), the state
// reset, the rows' keys and the fused tiles' lanes.
template <class Target>
SDPA_INLINE void StartQBlock(const ForwardCall& call, const QueryTile& q, FlashScratch& ws,
                             bool bf16) {
  const AttentionParams& p = call.p;
  const RowView q_rows(p.q, q.b, q.h);
  if (bf16) {
    // Unscaled: the scale multiplies the float32 scores (exact either way for powers of
    // two, one rounding less otherwise).
    pack_bf16_rows(q_rows, q.q_begin, q.rows, {ws.q_bf16, ws.head_dim_qk_pairs2});
  } else {
    pack_rows(q_rows, q.q_begin, q.rows, {ws.q, p.head_dim_qk}, call.scale);
  }
  ResetRows(ws.total, q.rows);
  std::fill(ws.partial.l, ws.partial.l + round_up(q.rows, kMaxLanes), 0.0f);
  std::fill(ws.partial.o, ws.partial.o + q.rows * ws.partial.o_stride, 0.0f);
  for (int64_t r = 0; r < q.rows; ++r) {
    ws.row_keys[r] = row_columns(p.mask, q.b, q.q_begin + r, p.q_len, p.kv_len);
  }
  if constexpr (Target::kFusedTiles) {
    std::fill(ws.partial.l_lanes, ws.partial.l_lanes + q.rows * 16, 0.0f);
  }
}

// FlashQBlock's body, on the target's traits (TargetKernels): a template so that the
// branches of kernels the target lacks are discarded, not compiled.
template <class Target>
SDPA_INLINE void FlashQBlockWith(const ForwardCall& call, const QueryTile& q, FlashScratch& ws) {
  const AttentionParams& p = call.p;
  const int64_t S = p.kv_len, rows = q.rows;
  const int64_t ev_pad = ws.head_dim_vo_padded;
  const DenseMaskRows dense(p.mask, q.b, q.h);
  const HeadMasking masking{p.mask, dense, &ws.flex, q.b, q.h, p.q_len, S};
  const bool alibi = !p.mask.alibi_slopes.empty();  // added per tile by AlibiTile

  const bool bf16 = Target::kBf16Dot && ws.bf16_dot;
  // P goes to bf16 as the softmax computes it, except where dropout needs float32 P.
  const bool p_in_bf16 = bf16 && !p.has_dropout();
  // On AMX, P.v waits for kPvGroup key tiles, and the running max rises lazily.
  const bool group_pv = p_in_bf16 && ws.amx.active();
  ws.pending_tiles = 0;
  StartQBlock<Target>(call, q, ws, bf16);
  int64_t partial_tiles = 0;  // key tiles summed in ws.partial
  // float32: P.v goes to partial.o, whose rescale the product folds in; total.o's waits
  // in o_scale until the flush (bf16's P.v goes to total.o, rescaled at once).
  float o_scale[kBlockQ];
  std::fill(o_scale, o_scale + rows, 1.0f);
  float* const flush_o_scale = bf16 ? nullptr : o_scale;
  // Whether partial.l_lanes holds row sums not yet in partial.l (fused tiles).
  bool sums_in_lanes = false;

  // Key tiles outside every row's band are never visited.
  const KvTileRange tiles = VisibleKvTiles(p, &ws.flex, q);
  for (int64_t j0 = tiles.first; j0 < tiles.end; j0 += kBlockKv) {
    const int64_t cols = std::min(kBlockKv, S - j0);
    TileKeySet set;
    // A tile that changes no row is skipped.
    if (!TileKeys(masking, ws, {q.q_begin, rows, nullptr, j0, cols}, set)) continue;
    const ColumnRange* keys = set.keys;
    // A flex tile that needs nothing per element is fused too (its score_mod, if any, on
    // the registers): only targets with fused tiles, whose masked path it skips.
    const bool tile_needs_mask = TileNeedsMask(p, &ws.flex, ws.row_keys, rows, j0);
    const bool flex_fused =
        Target::kFusedTiles && tile_needs_mask && FlexTileInRegisters(p, ws, set, rows, j0, bf16);
    const bool needs_mask = tile_needs_mask && !flex_fused;
    const PackedKv::Tile t = call.kv.tile(p, q.b, q.h / p.group_size(), j0 / kBlockKv, ws.row);

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
    // A float32 tile masked by row intervals only is masked in registers, computing just
    // the key vectors those intervals reach (QkBandSoftmaxTileF32).
    const bool band_fused =
        Target::kFusedTiles && needs_mask && !bf16 && BandTileInRegisters(p, ws, set, rows);
    // Nothing but ALiBi changes the scores: q.k^T and the softmax in registers (bf16
    // needs a positive scale, which its softmax multiplies in; float32 q carries it, and
    // only float32 adds ALiBi there, AlibiRows; band_fused excludes it). On AMX the tile
    // GEMM into ws.scores and the softmax after it are faster than vdpbf16ps in registers.
    const bool fused = (!needs_mask || band_fused) && (!alibi || !bf16) &&
                       (!bf16 || (p_in_bf16 && call.scale > 0.0f && !ws.amx.active()));
    if constexpr (Target::kFusedTiles) {
      if (fused) {
        if (bf16) {
          const int64_t e2 = ws.head_dim_qk_pairs2;
          Target::QkSoftmaxBf16({ws.q_bf16, e2, rows}, {t.k_pairs, e2 / 2}, call.scale, ws.partial,
                                ws.p_bf16);
        } else if (band_fused) {
          static_assert(!Target::kFusedTiles || kGemmRows == 6,
                        "P.v's panels read the band kernel's P lanes");
          Target::QkBandSoftmaxF32({ws.q, p.head_dim_qk, rows}, {t.k_t, p.head_dim_qk}, begin, end,
                                   ws.partial, ws.scores);
        } else if (flex_fused && ws.flex.score_mod) {
          Target::QkScoreModSoftmaxF32({ws.q, p.head_dim_qk, rows}, {t.k_t, p.head_dim_qk},
                                       {&*ws.flex.score_mod, q.b, q.h, q.q_begin, j0}, ws.partial,
                                       ws.scores);
        } else if (alibi) {
          const AlibiRow row0 = alibi_row(p.mask, q.h, q.q_begin, p.q_len, S);
          Target::QkAlibiSoftmaxF32({ws.q, p.head_dim_qk, rows}, {t.k_t, p.head_dim_qk},
                                    {row0.slope, j0 - row0.center}, ws.partial, ws.scores);
        } else {
          Target::QkSoftmaxF32({ws.q, p.head_dim_qk, rows}, {t.k_t, p.head_dim_qk}, ws.partial,
                               ws.scores);
        }
      }
      // Float32 tiles all take the lazy softmax (ScoresAndSoftmax's too): their row sums
      // stay in lanes. A bf16 tile that is not fused needs them in l.
      if (fused || !bf16) {
        sums_in_lanes = true;
      } else if (sums_in_lanes) {
        Target::FoldLaneSums(ws.partial, rows);
        sums_in_lanes = false;
      }
    }
    if (!(Target::kFusedTiles && fused)) {
      const TileRows tile_rows{q,
                               j0,
                               cols,
                               &masking,
                               keys,
                               set.blocks_applied,
                               trimmed ? &support : nullptr,
                               needs_mask,
                               p_in_bf16,
                               group_pv ? kLazyMaxSlack : 0.0f};
      ScoresAndSoftmax<Target>(call, tile_rows, t, ws);
    }
    // The softmax rescaled partial.l itself.
    if (bf16) {
      // The waiting P.v is relative to the max before this tile's.
      if (group_pv && std::any_of(ws.total.alpha, ws.total.alpha + rows,
                                  [](float a) { return a != 1.0f; })) {
        FlushGroupPv(ws, rows);
      }
      ApplyRescale(ws.total, rows, true);
    } else {
      DeferRescale(ws.total, rows, o_scale);
    }
    for (int64_t r = 0; r < rows && p.has_dropout(); ++r) {
      apply_dropout(p, {q.b, q.h, q.q_begin + r, j0}, ws.scores + r * kBlockKv, cols);
    }

    if (bf16) {
      // P in bf16 for the second product, as FlashAttention does on GPUs.
      for (int64_t r = 0; r < rows && !p_in_bf16; ++r) {
        ConvertRowToBf16(ws.scores + r * kBlockKv, ws.p_bf16 + r * kBlockKv, kBlockKv);
      }
      // Straight into total.o: P's bf16 rounding (2^-9) dwarfs the accumulator's, and the
      // partial sums cost the bf16 forward 2%.
      if (group_pv) {
        GroupPv(ws, rows, t.v_pairs);
      } else {
        Bf16GemmOn(ws.amx.active(), {rows, ev_pad, kBlockKv / 2}, {ws.p_bf16, kBlockKv},
                   t.v_pairs, {ws.total.o, ev_pad}, GemmOutput::kAccumulate);
      }
    } else if (trimmed) {
      GemmAccumulateRowSupport({rows, ev_pad, cols}, {ws.scores, kBlockKv}, {t.v, t.v_ld},
                               {ws.partial.o, ev_pad}, support, ws.partial.alpha);
    } else {
      Gemm({rows, ev_pad, cols}, {ws.scores, kBlockKv}, {t.v, t.v_ld}, {ws.partial.o, ev_pad},
           GemmOutput::kAccumulate, ws.partial.alpha);
    }
    // The partial sums of the last key tiles go into the total.
    if (++partial_tiles == kTilesPerPartialSum) {
      AddPartial(ws.partial, ws.total, rows, flush_o_scale);
      partial_tiles = 0;
    }
  }

  if constexpr (Target::kFusedTiles) {
    if (sums_in_lanes) Target::FoldLaneSums(ws.partial, rows);
  }
  FlushGroupPv(ws, rows);
  AddPartial(ws.partial, ws.total, rows, flush_o_scale);
  FinishRows(ws.total, rows, RowView(call.out, q.b, q.h), q.q_begin,
             call.lse + query_row_index(p, q.b, q.h, q.q_begin));
}

void FlashQBlock(const ForwardCall& call, const QueryTile& q, FlashScratch& ws) {
  FlashQBlockWith<TargetKernels>(call, q, ws);
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
