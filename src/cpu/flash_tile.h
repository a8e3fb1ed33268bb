#pragma once
// The per-query-block body of the CPU flash forward, compiled once per SIMD target
// (flash_tile.cc), and the scratch memory one thread reuses across blocks.

#include <cstdint>

#include "cpu/amx_bf16.h"
#include "cpu/capability.h"
#include "cpu/kernel_context.h"
#include "cpu/mask_rows.h"
#include "cpu/online_softmax.h"
#include "flex/row_state.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// Tile sizes. kBlockKv is a multiple of every target's float lane count (16 on AVX-512)
/// so score rows need no remainder handling; 64 x 64 float tiles of q, k, v, scores and
/// the output accumulator (~80 KB at head_dim 64) stay in L2.
inline constexpr int64_t kBlockQ = 64;
inline constexpr int64_t kBlockKv = 64;
inline constexpr int64_t kMaxLanes = 16;

/// P.v and the probability sums of this many consecutive key tiles are summed into zeroed
/// partial sums before they are added to the output accumulator and the row sum: those
/// then take one rounding per 512 keys (PyTorch's CPU kernel blocks keys by 512 too), not
/// one per tile. Unmasked rows of 65536 keys erred 1.35e-6 (AVX2) with one rounding per
/// tile, against torch's 6.4e-7 on the same inputs.
inline constexpr int64_t kTilesPerPartialSum = 8;

/// On AMX, P.v waits for up to this many key tiles and runs as one GEMM over their keys:
/// each P.v loads and stores the output accumulator's tiles (32 KB at Ev = 128), and over
/// a single key tile (two k-steps) those loads and stores, not the tile products, bound it
/// (2.1 us against 1.0 us for q.k^T's as many products, on one Xeon core). The running
/// max then rises only by more than kLazyMaxSlack (RaiseRowMaxes), so that a tile rarely
/// needs the waiting P.v done before it rescales the output.
inline constexpr int64_t kPvGroup = 4;
/// ln 256: probabilities up to 256 while a row's max is kept (bf16 P keeps its relative
/// precision at any magnitude).
inline constexpr float kLazyMaxSlack = 5.5451774f;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/// Whether the flash forward of `params` takes the vdpbf16ps path.
bool uses_bf16_dot(const AttentionParams& params);
/// Whether the split-KV decode of `params` may: uses_bf16_dot, or a bfloat16 call on a
/// float8_e4m3fn cache, whose codes its kernels widen to bf16 as they load them; both on
/// CPUs with AVX512_VBMI only (vbmi_available).
bool decode_uses_bf16_dot(const AttentionParams& params);

/// One thread's float32 working set, 64-byte aligned:
///   q [kBlockQ, E] (pre-scaled), scores [kBlockQ, kBlockKv], the online-softmax state
///   (total and partial: m / l / l_partial / alpha [kBlockQ], o and o_partial [kBlockQ,
///   Ev_pad], l_lanes [kBlockQ, 16]), row [max(E, Ev)] (one converted input row).
/// `bf16_dot`: uses_bf16_dot(params), decided on the calling thread (a capability set by
/// set_cpu_capability holds for that thread only, not for OpenMP workers).
struct FlashScratch {
  FlashScratch(const AttentionParams& params, bool bf16_dot);
  ~FlashScratch();
  FlashScratch(const FlashScratch&) = delete;
  FlashScratch& operator=(const FlashScratch&) = delete;

  int64_t head_dim_vo_padded;
  /// Whether this call multiplies bf16 with vdpbf16ps (bf16 inputs on an AVX512_BF16 CPU
  /// at the AVX512 level): q_bf16 and p_bf16 are then used instead of q.
  bool bf16_dot;
  /// Even E (head_dim rounded up to pairs).
  int64_t head_dim_qk_pairs2;
  float* q;
  float* scores;
  /// The q-block's online-softmax state (online_softmax.h). The softmax kernels update
  /// `partial`, which holds the sums of the key tiles since `total` last took them
  /// (kTilesPerPartialSum; l_lanes: fused tiles' sums not yet in partial.l); both share m
  /// and alpha.
  SoftmaxRows total;
  SoftmaxRows partial;
  float* row;
  uint16_t* q_bf16;  ///< [kBlockQ, head_dim_qk_pairs2] bf16 bits, unscaled
  uint16_t* p_bf16;  ///< [kBlockQ, kBlockKv] bf16 bits of P
  /// AMX: P of the key tiles whose P.v waits ([kBlockQ, kPvGroup * kBlockKv] bf16 bits),
  /// their value pairs and how many there are.
  uint16_t* p_group;
  const uint16_t* v_group[kPvGroup];
  int64_t pending_tiles = 0;
  /// row_columns() of the current q-block's rows.
  ColumnRange row_keys[kBlockQ];
  /// Flex program buffers and BlockMask lookup (inactive without flex).
  flex::RowState flex;
  /// With bf16_dot on an AMX CPU: this thread's tiles, configured while the scratch lives
  /// (the bf16 GEMMs then run on AMX).
  AmxTiles amx;

 private:
  Tensor buffer_;
};

/// Computes query rows `q` (at most kBlockQ) of out / lse for one (batch, head), reading
/// k/v tiles from call.kv (packed on first use for that head's kv head; see PackedKv::tile).
using FlashQBlockFn = void (*)(const ForwardCall& call, const QueryTile& q, FlashScratch& scratch);

/// The q-block function compiled for `capability`.
FlashQBlockFn flash_q_block_for(Capability capability);

}  // namespace sdpa::cpu
