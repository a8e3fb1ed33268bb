#pragma once
// The two KV cache layouts of attention_with_kvcache: one contiguous [B, S_max, Hkv, D]
// cache per sequence, or a paged pool [num_pages, page_size, Hkv, D] addressed through a
// block table (vLLM / FlashInfer / flash-attn), read in place either way.

#include <cstdint>
#include <memory>

#include "sdpa/params.h"
#include "sdpa/tensor.h"

namespace sdpa::serving {

/// Checks that t is a CPU tensor of `dims` dimensions (`layout` names them in the
/// message); `entry` names the serving call.
void check_dims(const Tensor& t, const char* name, int64_t dims, const char* layout,
                const char* entry = "attention_with_kvcache");
/// Checks t.size(dim) == expected (`what` names the expected value in the message).
void check_size(const Tensor& t, const char* name, int64_t dim, int64_t expected,
                const char* what);

class CacheLayout {
 public:
  /// Checks k_cache / v_cache (dtype `dtype`, or both float8_e4m3fn; head dimension E of
  /// q; Ev from v_cache), block_table (undefined: contiguous caches of batch B) and the
  /// float8 caches' scales k_scale / v_scale (float32 [] or [Hkv]; undefined: 1; refused
  /// for other caches) and returns their layout; throws sdpa::Error naming the argument.
  CacheLayout(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_table,
              int64_t batch, DType dtype, int64_t head_dim, const Tensor& k_scale = {},
              const Tensor& v_scale = {});

  /// Positions each sequence can hold: S_max, or max_pages * page_size.
  int64_t capacity() const { return capacity_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t value_dim() const { return value_dim_; }
  /// A float8_e4m3fn cache's per-head scales, for the kernels; null for other caches.
  const std::shared_ptr<const KvDequant>& dequant() const { return dequant_; }
  /// Sequence b's pages (its block_table row as a [1, max_pages] table), for the call on
  /// rows(., b, n); null for contiguous caches.
  std::shared_ptr<const KvPages> pages(int64_t b) const;

  /// Checks that the pages holding sequence b's first n positions are inside the pool.
  void check_pages(int64_t b, int64_t n) const;
  /// Sequence b's first n keys (values: of v_cache) as a [1, Hkv, n, D] view (paged: a
  /// view whose rows the kernels read through pages()).
  Tensor rows(bool values, int64_t b, int64_t n) const;
  /// Writes `rows` [L_new, Hkv, D] at positions [at, at + L_new) of sequence b; into a
  /// float8 cache as float8_e4m3fn(x / scale[h]) (rounded to nearest even, saturating).
  void write(bool values, int64_t b, int64_t at, const Tensor& rows) const;

 private:
  Tensor k_cache_, v_cache_;
  int64_t capacity_ = 0, kv_heads_ = 0, value_dim_ = 0;
  std::shared_ptr<const KvPages> pages_;
  std::shared_ptr<const KvDequant> dequant_;
};

}  // namespace sdpa::serving
