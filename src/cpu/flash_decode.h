#pragma once
// The CPU flash forward for calls with few query rows per kv head (decoding: L = 1 to a
// few, with GQA): split-KV. The keys are cut into chunks (decode_chunk_len); each
// (batch, kv head, chunk) item runs every query row of the kv head's GQA group over its
// chunk (reading each key and value once, converted tile by tile, no packing) and leaves a
// partial (unnormalized output, running max, running sum); the partials are then merged
// by their logsumexp (FlashDecoding: Dao et al., 2023; the merge of
// merge_attention_states). The chunk size does not depend on the thread count, so results
// are bit-identical for any number of threads.

#include <cstdint>

#include "cpu/capability.h"
#include "cpu/flash_tile.h"
#include "cpu/online_softmax.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// Keys per split-KV chunk: kDecodeChunk, or up to kDecodeMaxChunk (doubling) while the
/// call keeps at least kDecodeMinItems (batch, kv head, chunk) items. Each chunk starts
/// new K and V streams; 2048-key chunks read 7% faster than 512-key ones at S = 32768
/// (`sdpa_decode_bandwidth`). Multiples of kBlockKv.
inline constexpr int64_t kDecodeChunk = 512;
inline constexpr int64_t kDecodeMaxChunk = 2048;
inline constexpr int64_t kDecodeMinItems = 128;

/// The chunk length of `params`: it depends on the shapes only, never on the thread
/// count, so the merged result is bit-identical for any number of threads.
int64_t decode_chunk_len(const AttentionParams& params);

/// Padding of the decode path's float32 rows (q, value accumulators): a whole split block
/// (two vectors) of the widest target, and one vdpbf16ps input of 32 bf16.
inline constexpr int64_t kDecodeRowPad = 2 * kMaxLanes;
/// Most query rows per kv head (GQA group size x L) the decode path takes: it computes
/// scores as per-row dot products, which beat the tile GEMMs only for a few rows.
inline constexpr int64_t kDecodeMaxRows = 16;

/// Whether `params` (a forward call) takes the split-KV decode path.
bool use_decode_path(const AttentionParams& params);

/// Most bytes of one tile's key and value rows a decode item reads for its block of kv
/// heads (kv_heads_per_item; float8 rows counted at 2 bytes, as a stage may widen them):
/// the tile (in place or copied into the stage) stays in L2 while each head reads its rows.
inline constexpr int64_t kDecodeStageBytes = 256 * 1024;
/// Most kv heads per decode item (the item keeps each head's softmax state on the stack).
inline constexpr int64_t kDecodeMaxItemHeads = 16;

/// How many kv heads one decode item runs (>= 1). Where the kv heads' rows of a key lie
/// side by side (a [.., S, Hkv, E] cache, contiguous or paged: one head's rows are then
/// strided), an item takes a block of heads and runs them tile by tile, so that memory
/// streams each key tile's whole rows, at about 1.5x the rate of one head's strided slices
/// (issue 25's paged decode): the heads read the tile in place, or copied into a stage
/// (DecodeScratch::stage_tiles). 1 otherwise.
int64_t kv_heads_per_item(const AttentionParams& params);

/// Element type of key and value rows the decode path reads in place (k and v share it).
enum class KvRows { kBFloat16, kFloat16, kFloat32, kFloat8E4M3FN };

/// A float8_e4m3fn element read in place comes out of the decode kernels' conversion as
/// its value / 256 (decode_rows-inl.h): the routes fold 256 into the cache's scales.
inline constexpr float kE4M3FNInPlaceFactor = 256.0f;

/// The key tile after the current one of a decode item of several kv heads: its rows'
/// first head's key and value rows (null past the item's visible keys; value rows only
/// where the item stages its tiles: in place, the P.v pass requests them). Each head requests
/// its slice of the next tile's rows into L2 as it scores, so memory streams the next tile
/// during the heads' arithmetic instead of idling until the next copy (sdpa_paged_decode's
/// bfloat16 pages 7% faster when staged; 11% at the AVX2 level).
struct StagedTileAhead {
  const char* k_rows[kBlockKv];
  const char* v_rows[kBlockKv];
};

/// One thread's float32 working set for decode items. `bf16_dot`: uses_bf16_dot(params),
/// or a bfloat16 call on a float8 cache at that level, decided on the calling thread (as
/// FlashScratch's).
struct DecodeScratch {
  DecodeScratch(const AttentionParams& params, bool bf16_dot);
  /// kv_heads_per_item(params): the q slots and the stage hold this many heads.
  int64_t heads;
  int64_t head_dim_qk_padded, head_dim_vo_padded;  ///< rounded up to kDecodeRowPad
  /// Scores through vdpbf16ps (uses_bf16_dot) from key rows read in place, when the keys
  /// are bfloat16 or float8_e4m3fn (widened to bf16) rows of unit stride; q then also as
  /// bf16 bits, unscaled.
  bool bf16_keys;
  /// P.v through vdpbf16ps from value rows read in place (bf16_keys and bfloat16 values
  /// of unit stride); P is rounded to bf16, as the FLASH forward's bf16 path does.
  bool bf16_values;
  /// Keys (values) are bfloat16, float16 or float32 rows of unit stride: unless vdpbf16ps
  /// takes them they are loaded (widened) in registers where read (decode_rows-inl.h)
  /// instead of through `tile`, their type being `kv_rows`.
  bool key_rows_in_place, value_rows_in_place;
  KvRows kv_rows;
  uint16_t* q_bf16;  ///< [heads, rows, E_pad] when bf16_keys
  uint16_t* p_bf16;  ///< [rows, kBlockKv] when bf16_values
  float* q;          ///< [heads, rows, E_pad], pre-scaled
  /// When stage_tiles: a key tile's rows of the item's heads, [kBlockKv, heads, E] and
  /// [kBlockKv, heads, Ev] in the cache's dtype, or widened to bf16 (stage_widens).
  void* stage_k;
  void* stage_v;
  /// The stage holds a float8 cache's codes widened to bf16 (exact), for the vdpbf16ps
  /// routes: the widening then runs in the copy, which waits on memory anyway, not in the
  /// kernels. Set for float8 caches where bf16_keys and bf16_values hold and heads > 1.
  bool stage_widens;
  /// The stage's dtype (the cache's, or bfloat16 when stage_widens).
  DType stage_dtype(DType cache) const { return stage_widens ? DType::kBFloat16 : cache; }
  /// Whether an item of several heads copies each key tile into the stage before its heads
  /// read it. Not for bfloat16 rows that the vdpbf16ps routes read in place (bf16_values,
  /// keys in runs of 16 rows one stride apart): there the heads read the cache, each
  /// requesting its slices of the next tile's key rows as it scores and the P.v pass its
  /// value rows, which read the paged benchmark's caches 7% (pages of 16) to 23%
  /// (contiguous) faster than copying them first.
  bool stage_tiles;
  float* scores;     ///< [rows, kBlockKv]
  float* tile;       ///< [kBlockKv, max(E_pad, Ev_pad)]: a tile's keys, then its values,
                     ///< converted to float32
  ColumnRange row_keys[kDecodeMaxRows];
  flex::RowState flex;
  StagedTileAhead ahead;  ///< when heads > 1

 private:
  Tensor buffer_;
};

/// One work item of the split-KV decode: for each kv head hk + [0, heads) of batch `b`,
/// its query rows (the GQA group's heads times q_len, ordered (query head of the group,
/// query position)) over keys [kv_begin, kv_end).
struct DecodeItem {
  int64_t b;
  int64_t hk;
  int64_t kv_begin;
  int64_t kv_end;
  int64_t heads = 1;
};

/// Runs `item` and writes the partial online-softmax state (online_softmax.h) of head
/// hk + h's rows to out[h]: o [rows, Ev_pad] (unnormalized output), m and l [rows] (l = 0
/// for a row without a visible key in the chunk). alpha is not used.
using DecodeChunkFn = void (*)(const AttentionParams& params, const DecodeItem& item,
                               DecodeScratch& scratch, const SoftmaxRows* out);

/// The chunk function compiled for `capability`.
DecodeChunkFn decode_chunk_for(Capability capability);

/// The forward of a call for which use_decode_path() holds.
void flash_decode(const AttentionParams& params, const Tensor& out, const Tensor& lse);

}  // namespace sdpa::cpu
