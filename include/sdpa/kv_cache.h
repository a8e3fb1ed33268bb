#pragma once
// Attention through a KV cache (decoding and chunked prefill), in flash-attn's
// flash_attn_with_kvcache shape: BSHD tensors, per-sequence cache lengths, new keys and
// values appended in place, rotary embedding applied on the way.

#include <optional>
#include <vector>

#include "sdpa/sdpa.h"
#include "sdpa/sequence_options.h"

namespace sdpa {

/// Options of attention_with_kvcache (flash-attn's keyword arguments): the per-sequence
/// masks, ALiBi, soft-cap and scale of SequenceOptions, plus what the cache call adds.
struct KvCacheOptions : SequenceOptions {
  /// New keys / values [B, L_new, Hkv, E] / [B, L_new, Hkv, Ev] of the cache's dtype, both
  /// or neither: appended to the cache at each sequence's cache_seqlens before attending.
  Tensor k_new, v_new;
  /// Rotary embedding tables [max_positions, rotary_dim / 2] (float32 or the query dtype),
  /// both or neither; rotary_dim (even, <= E) leading features of q and k_new rotate.
  Tensor rotary_cos, rotary_sin;
  /// GPT-J's pairs (x[2d], x[2d+1]) when true; GPT-NeoX's halves (x[d], x[d + R/2]) else.
  bool rotary_interleaved = false;
  /// Paged cache (vLLM / FlashInfer / flash-attn layout): int32 [B, max_pages]; sequence
  /// b's position j is row j % page_size of page block_table[b][j / page_size] of
  /// k_cache [num_pages, page_size, Hkv, E] / v_cache [num_pages, page_size, Hkv, Ev].
  /// Pages are read and written in place. Undefined: contiguous [B, S_max, ...] caches.
  Tensor block_table;
  /// float8_e4m3fn caches (k_cache and v_cache both): the dequantization scales, float32
  /// [] or [Hkv]: element x of kv head h of k_cache means float(x) * k_scale[h] (v_scale
  /// for v_cache). k_new / v_new then have q's dtype and are stored as float8_e4m3fn(x /
  /// scale[h]), rounded to nearest even and saturated to +-448 (vLLM's and llama.cpp's
  /// quantized KV caches). Undefined: 1. Refused for caches of other dtypes.
  Tensor k_scale, v_scale;
};

/// Attention of q against a KV cache (flash-attn's flash_attn_with_kvcache).
///   q [B, L, Hq, E]; k_cache [B, S_max, Hkv, E], v_cache [B, S_max, Hkv, Ev] of q's dtype
///   (float32, bfloat16 or float16; any strides), or both float8_e4m3fn with the options'
///   k_scale / v_scale (a quantized cache, read in place); cache_seqlens int32 [B]: the valid
///   length of each sequence's cache. Hq % Hkv == 0 (GQA). With options.block_table the
///   caches are page pools [num_pages, page_size, Hkv, E/Ev] instead (paged KV cache:
///   every row below is found through the table; pages are read and written in place).
/// In order: rotates q and options.k_new by the rotary tables (k_new at positions
/// cache_seqlens[b] + i; q likewise when causal or windowed, else all at cache_seqlens[b],
/// flash-attn's convention); writes k_new / v_new into the caches at rows
/// [cache_seqlens[b], cache_seqlens[b] + L_new) (the caches are modified in place;
/// cache_seqlens is not); then attends over each sequence's first n_b = cache_seqlens[b] +
/// L_new keys with the options' mask, ALiBi and soft-cap, through the usual backend
/// selection (the CPU's split-KV decode path for few query rows).
/// Returns out [B, L, Hq, Ev] (contiguous, q's dtype) and lse [B, Hq, L] float32; a query
/// row that sees no key gives out 0 and lse -inf.
/// Throws sdpa::Error naming the argument for any shape, dtype, device or value that does
/// not fit (a length past the cache's capacity, a rotary table too short, non-int32
/// cache_seqlens, a block_table entry outside the pool
/// for a page a sequence uses); every check runs before the caches are written, so a
/// refused call leaves them untouched.
AttentionResult attention_with_kvcache(const Tensor& q, const Tensor& k_cache,
                                       const Tensor& v_cache, const Tensor& cache_seqlens,
                                       const KvCacheOptions& options = {});

/// Writes new keys and values into a paged cache without attending (FlashInfer's
/// append_paged_kv_cache, one run of positions per sequence): k_new [B, L_new, Hkv, E] and
/// v_new [B, L_new, Hkv, Ev] go to positions [positions[b], positions[b] + L_new) of
/// sequence b, through block_table int32 [B, max_pages] into the page pools k_cache
/// [num_pages, page_size, Hkv, E] / v_cache [num_pages, page_size, Hkv, Ev] (k_new's
/// dtype, or float8_e4m3fn: then quantized with k_scale / v_scale as in KvCacheOptions).
/// positions: int32 [B]. Throws sdpa::Error naming the argument for shapes, dtypes, scales,
/// positions past the capacity or table entries outside the pool, before writing anything.
void append_paged_kv_cache(const Tensor& k_new, const Tensor& v_new, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& block_table,
                           const Tensor& positions, const Tensor& k_scale = {},
                           const Tensor& v_scale = {});

/// Applies rotary position embedding (RoPE; Su et al., "RoFormer", 2021) to x [B, L, H, E]
/// in place: row (b, i) at position positions[b] + i (position_step 1) or positions[b]
/// (position_step 0), rotating its first 2 * cos.size(1) features; cos/sin as in
/// KvCacheOptions. Throws sdpa::Error for shapes that do not fit or positions outside the
/// tables (before writing anything).
void apply_rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin,
                            const std::vector<int64_t>& positions, int64_t position_step,
                            bool interleaved);

}  // namespace sdpa
