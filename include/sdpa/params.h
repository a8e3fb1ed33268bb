#pragma once
// AttentionParams: the single normalized description of one attention call. Selection
// checks and kernels read only this struct.

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "sdpa/generator.h"
#include "sdpa/tensor.h"

namespace sdpa {

namespace flex {
class Program;
struct BlockMask;
}  // namespace flex

/// Where a band's diagonal sits when q_len != kv_len (cuDNN's diagonal alignment;
/// PyTorch's CausalVariant UPPER_LEFT / LOWER_RIGHT).
enum class DiagonalAlignment { kTopLeft, kBottomRight };

/// The coordinates a band is measured in. kSequence: query i of q_len, key j of kv_len.
/// kDocument: relative to the row's document (packed varlen), so "causal inside each
/// document" is one band. kValidKeys: query i of q_len, key j of the batch's valid keys
/// [0, kv_lengths[b]) (right padding). Each band keeps its own frame when composed, so a
/// composition is exactly the intersection of its parts.
enum class BandFrame { kSequence, kDocument, kValidKeys };

/// A diagonal band of allowed (query i, key j) pairs: in its frame, with d = 0
/// (top-left) or kv_len - q_len (bottom-right), key j takes part when
///   i + d - left <= j <= i + d + right,
/// an absent bound being unbounded. Causal is right = 0; a sliding window adds left = W.
struct DiagonalBand {
  DiagonalAlignment alignment = DiagonalAlignment::kTopLeft;
  std::optional<int64_t> left;
  std::optional<int64_t> right;
  BandFrame frame = BandFrame::kSequence;
};

/// How a dense mask tensor acts on the scores.
enum class DenseMaskKind { kNone, kBoolKeep, kAdditive };

/// The native mask descriptor every fused kernel understands without an L x S tensor,
/// plus the one materialized kind (a dense tensor with broadcast strides). All parts
/// combine: masks intersect, additive terms add.
struct MaskDescriptor {
  /// Diagonal bands; a key must lie inside every one.
  std::vector<DiagonalBand> bands;
  /// Packed documents: query rows [cu_seqlens_q[d], cu_seqlens_q[d+1]) see only keys
  /// [cu_seqlens_kv[d], cu_seqlens_kv[d+1]). Empty when the call has no documents.
  std::vector<int64_t> cu_seqlens_q, cu_seqlens_kv;
  /// Valid keys per batch (right padding); empty when none.
  std::vector<int64_t> kv_lengths;
  /// ALiBi: adds -alibi_slopes[h] * |i + d - j| (d from alibi_alignment, sequence frame).
  std::vector<float> alibi_slopes;
  DiagonalAlignment alibi_alignment = DiagonalAlignment::kBottomRight;
  /// Flex attention: score_mod rewrites the scaled scores (after the additive terms
  /// above); a BlockMask skips empty blocks and evaluates its mask_mod on partial ones.
  std::shared_ptr<const flex::Program> score_mod;
  std::shared_ptr<const flex::BlockMask> block_mask;
  DenseMaskKind dense_kind = DenseMaskKind::kNone;
  /// [B, Hq, L, S] view (zero strides where broadcast): bool (true = take part) or
  /// additive in the query dtype. Undefined when dense_kind == kNone.
  Tensor dense;

  bool has_documents() const { return !cu_seqlens_q.empty(); }
  bool empty() const {
    return bands.empty() && !has_documents() && kv_lengths.empty() && alibi_slopes.empty() &&
           !score_mod && !block_mask && dense_kind == DenseMaskKind::kNone;
  }
};

/// Dropout of the attention probabilities (inverted scaling by 1 / (1 - p)). Score
/// (b, h, i, j) draws as score (b, h, q_offset + i, kv_offset + j) of [B, Hq, q_total,
/// kv_total] (DropoutPosition, sdpa.h); totals of 0 mean the call's own L and S.
struct DropoutParams {
  double p = 0.0;
  PhiloxState philox;
  int64_t q_offset = 0, kv_offset = 0, q_total = 0, kv_total = 0;

  /// Whether the call draws at a position of a larger call (not its own [0, L) x [0, S)).
  bool positioned() const { return q_offset != 0 || kv_offset != 0 || q_total != 0 || kv_total != 0; }
};

class AttnBias;

/// A paged KV cache (the layout vLLM, FlashInfer and flash-attn share): key j of batch b
/// is row j % page_size of page block_table[b][j / page_size] of the page pools
/// [num_pages, page_size, Hkv, E] / [..., Ev]. AttentionParams::k / v are then views
/// [B, Hkv, S, E] of the pools whose strides address rows within one page only (batch
/// stride 0); the CPU kernels read every row through the table (cpu/kv_rows.h). Set only
/// by the serving entry points (attention_with_kvcache with a block_table).
struct KvPages {
  Tensor block_table;  ///< int32 [B, max_pages], entries checked against num_pages
  int64_t page_size = 0;
  int64_t k_page_stride = 0, v_page_stride = 0;  ///< elements from one page to the next
  Tensor k_pool, v_pool;  ///< the pools the views point into (kept alive)
};

/// How the kernels read a float8_e4m3fn KV cache (k / v of that dtype, q of another): key
/// element x of kv head hk is float(x) * k_scale[hk], value element x is float(x) *
/// v_scale[hk]. Set only by the serving entry points (attention_with_kvcache).
struct KvDequant {
  std::vector<float> k_scale, v_scale;  ///< [Hkv] each
};

/// The largest size of any query/key/value dimension: 2^62, far above any memory (inputs
/// may be broadcast views); kernels round sizes up to tiles without overflowing below it.
inline constexpr int64_t kMaxAttentionExtent = int64_t{1} << 62;

/// Normalized attention call. Tensors are 4-D views in the caller's memory:
///   q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], any element strides.
struct AttentionParams {
  Tensor q, k, v;
  int64_t batch = 0;
  int64_t num_heads_q = 0;
  int64_t num_heads_kv = 0;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t head_dim_qk = 0;
  int64_t head_dim_vo = 0;
  DType dtype = DType::kFloat32;
  Device device{};
  /// Multiplies q.k before softmax; 1/sqrt(E) unless the caller gave one.
  double scale = 1.0;
  MaskDescriptor mask;
  /// The bias the mask came from (null when none), kept so backends that do not run
  /// biases natively can materialize it.
  std::shared_ptr<const AttnBias> bias;
  DropoutParams dropout;
  bool enable_gqa = false;
  /// The caller passed 3-D tensors (no batch dimension); outputs drop it again.
  bool unbatched = false;
  /// A backward call: grad_out, out [B, Hq, L, Ev] and lse [B, Hq, L] (float32) are set.
  bool backward = false;
  Tensor grad_out, out, lse;
  /// Backward must also return the gradient of the dense additive mask.
  bool attn_mask_requires_grad = false;
  /// use_deterministic_algorithms was on when the call was made.
  bool deterministic = false;
  /// A float16 / bfloat16 call whose MATH forward rounds every intermediate to its dtype
  /// (backends::allow_fp16_bf16_reduction_math_sdp or the call's option).
  bool reduced_precision_math = false;
  /// CUDA tensors: the cudaStream_t the kernels are queued on (null: legacy default).
  void* stream = nullptr;
  /// k / v read through a page table (KvPages); null for ordinary strided k / v.
  std::shared_ptr<const KvPages> kv_pages;
  /// k / v are a float8_e4m3fn cache read through these scales; null otherwise.
  std::shared_ptr<const KvDequant> kv_dequant;

  int64_t group_size() const { return num_heads_kv == 0 ? 1 : num_heads_q / num_heads_kv; }
  bool has_dropout() const { return dropout.p > 0.0; }
};

}  // namespace sdpa
