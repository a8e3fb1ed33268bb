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

/// Element type of key and value rows the decode path reads in place (k and v share it).
enum class KvRows { kBFloat16, kFloat16, kFloat32, kFloat8E4M3FN };

/// A float8_e4m3fn element read in place comes out of the decode kernels' conversion as
/// its value / 256 (decode_rows-inl.h): the routes fold 256 into the cache's scales.
inline constexpr float kE4M3FNInPlaceFactor = 256.0f;

/// One thread's float32 working set for decode items. `bf16_dot`: uses_bf16_dot(params),
/// or a bfloat16 call on a float8 cache at that level, decided on the calling thread (as
/// FlashScratch's).
struct DecodeScratch {
  DecodeScratch(const AttentionParams& params, bool bf16_dot);
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
  uint16_t* q_bf16;  ///< [rows, E_pad] when bf16_keys
  uint16_t* p_bf16;  ///< [rows, kBlockKv] when bf16_values
  float* q;          ///< [rows, E_pad], pre-scaled
  float* scores;     ///< [rows, kBlockKv]
  float* tile;       ///< [kBlockKv, max(E_pad, Ev_pad)]: a tile's keys, then its values,
                     ///< converted to float32
  ColumnRange row_keys[kDecodeMaxRows];
  flex::RowState flex;

 private:
  Tensor buffer_;
};

/// One work item of the split-KV decode: the query rows of kv head `hk` of batch `b` (the
/// GQA group's heads times q_len, ordered (query head of the group, query position)) over
/// keys [kv_begin, kv_end).
struct DecodeItem {
  int64_t b;
  int64_t hk;
  int64_t kv_begin;
  int64_t kv_end;
};

/// Runs `item` and writes its rows' partial online-softmax state (online_softmax.h) to
/// `out`: o [rows, Ev_pad] (unnormalized output), m and l [rows] (l = 0 for a row without
/// a visible key in the chunk). out.alpha is not used.
using DecodeChunkFn = void (*)(const AttentionParams& params, const DecodeItem& item,
                               DecodeScratch& scratch, const SoftmaxRows& out);

/// The chunk function compiled for `capability`.
DecodeChunkFn decode_chunk_for(Capability capability);

/// The forward of a call for which use_decode_path() holds.
void flash_decode(const AttentionParams& params, const Tensor& out, const Tensor& lse);

}  // namespace sdpa::cpu
