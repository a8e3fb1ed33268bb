// attention_with_kvcache: validate everything, rotate, append in place, then one
// attention call per sequence over its exact cache length (views into the cache, no
// copies), so masks and ALiBi align to each sequence's own last key.

#include <vector>

#include "sdpa/error.h"
#include "sdpa/kv_cache.h"
#include "serving/cache_layout.h"
#include "serving/sequence_mask.h"

namespace sdpa {
namespace {

using serving::check_dims;
using serving::check_size;


// The per-sequence positions of `lengths` (int32 [B], named `name`), checked against the
// capacity left for `new_len` new keys.
std::vector<int64_t> read_positions(const Tensor& lengths, const char* name, int64_t batch,
                                    int64_t capacity, int64_t new_len) {
  SDPA_CHECK(lengths.defined() && lengths.dtype() == DType::kInt32, name,
             ": expected an int32 tensor [B], got ",
             lengths.defined() ? std::string(dtype_name(lengths.dtype())) : "none");
  SDPA_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, name, ": expected shape [", batch,
             "], got ", shape_str(lengths.sizes()));
  SDPA_CHECK(lengths.device() == Device{}, name, ": expected a CPU tensor, got ",
             device_name(lengths.device()));
  std::vector<int64_t> out(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = static_cast<int64_t>(lengths.item({b}));
    SDPA_CHECK(n >= 0, name, "[", b, "] = ", n, " is negative");
    SDPA_CHECK(n <= capacity - new_len, name, "[", b, "] = ", n, " with ", new_len,
               " new keys exceeds the cache's capacity of ", capacity, " positions");
    out[static_cast<size_t>(b)] = n;
  }
  return out;
}

// Checks k_new [B, L_new, Hkv, E] / v_new [B, L_new, Hkv, Ev] (both or neither, of dtype
// `dtype`, which `source` names: the cache's, or q's for a float8 cache that quantizes
// them; the cache's heads) and returns L_new (0 without them).
int64_t check_new_rows(const Tensor& k_new, const Tensor& v_new, const serving::CacheLayout& cache,
                       int64_t batch, DType dtype, const char* source, int64_t head_dim) {
  SDPA_CHECK(k_new.defined() == v_new.defined(), "k_new / v_new: expected both or neither, got only ",
             k_new.defined() ? "k_new" : "v_new");
  if (!k_new.defined()) return 0;
  check_dims(k_new, "k_new", 4, "[B, L_new, Hkv, E]");
  check_dims(v_new, "v_new", 4, "[B, L_new, Hkv, Ev]");
  const int64_t new_len = k_new.size(1);
  for (const auto& [t, name] : {std::pair{&k_new, "k_new"}, std::pair{&v_new, "v_new"}}) {
    SDPA_CHECK(t->dtype() == dtype, name, ": expected ", source, " ", dtype_name(dtype), ", got ",
               dtype_name(t->dtype()));
    check_size(*t, name, 0, batch, "the batch size B");
    check_size(*t, name, 1, new_len, "L_new of k_new");
    check_size(*t, name, 2, cache.kv_heads(), "the cache's kv head count Hkv");
  }
  check_size(k_new, "k_new", 3, head_dim, "the head dimension E");
  check_size(v_new, "v_new", 3, cache.value_dim(), "the value head dimension Ev of v_cache");
  return new_len;
}

// [L, H, E] rows of sequence b of a BSHD tensor as a [1, H, L, E] view.
Tensor heads_first(const Tensor& bshd, int64_t b, int64_t rows) {
  return bshd.select(0, b).slice(0, 0, rows).transpose(0, 1).unsqueeze(0);
}

}  // namespace

AttentionResult attention_with_kvcache(const Tensor& q, const Tensor& k_cache,
                                       const Tensor& v_cache, const Tensor& cache_seqlens,
                                       const KvCacheOptions& o) {
  check_dims(q, "q", 4, "[B, L, Hq, E]");
  const int64_t B = q.size(0), L = q.size(1), Hq = q.size(2), E = q.size(3);
  SDPA_CHECK(q.dtype() == DType::kFloat32 || q.dtype() == DType::kBFloat16 ||
                 q.dtype() == DType::kFloat16,
             "q: expected float32, bfloat16 or float16, got ", dtype_name(q.dtype()));
  const serving::CacheLayout cache(k_cache, v_cache, o.block_table, B, q.dtype(), E, o.k_scale,
                                   o.v_scale);
  const int64_t Hkv = cache.kv_heads(), Ev = cache.value_dim();
  SDPA_CHECK(Hkv > 0 && Hq % Hkv == 0, "q: the query head count ", Hq,
             " must be a multiple of the cache's kv head count ", Hkv, " (GQA)");
  const int64_t new_len = check_new_rows(o.k_new, o.v_new, cache, B, q.dtype(),
                                         cache.dequant() ? "q's dtype" : "the cache's dtype", E);
  const std::vector<int64_t> cached =
      read_positions(cache_seqlens, "cache_seqlens", B, cache.capacity(), new_len);
  for (int64_t b = 0; b < B; ++b) cache.check_pages(b, cached[static_cast<size_t>(b)] + new_len);
  serving::check_sequence_options(o, Hq);
  SDPA_CHECK(o.dropout_p == 0.0, "dropout_p: attention_with_kvcache is inference (as "
             "flash-attn's flash_attn_with_kvcache) and takes no dropout, got ", o.dropout_p);
  SDPA_CHECK(o.rotary_cos.defined() == o.rotary_sin.defined(),
             "rotary_cos / rotary_sin: expected both or neither");

  // Rotated copies first: nothing the caller owns changes until every check has passed.
  Tensor q_run = q, k_append = o.k_new;
  if (o.rotary_cos.defined()) {
    const bool q_at_own_positions = o.causal || o.window_left >= 0 || o.window_right >= 0;
    q_run = q.clone();
    apply_rotary_embedding(q_run, o.rotary_cos, o.rotary_sin, cached, q_at_own_positions ? 1 : 0,
                           o.rotary_interleaved);
    if (o.k_new.defined()) {
      k_append = o.k_new.clone();
      apply_rotary_embedding(k_append, o.rotary_cos, o.rotary_sin, cached, 1,
                             o.rotary_interleaved);
    }
  }
  std::vector<serving::SequenceCall> calls;
  calls.reserve(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = cached[static_cast<size_t>(b)] + new_len;
    calls.emplace_back(o, L, n, Hq != Hkv);
    // Validates the call (scale, mask sizes) before the append.
    calls.back().check(heads_first(q_run, b, L), cache.rows(false, b, n), cache.rows(true, b, n),
                       cache.dequant());
  }

  for (int64_t b = 0; b < B && new_len > 0; ++b) {
    const int64_t at = cached[static_cast<size_t>(b)];
    cache.write(false, b, at, k_append.select(0, b));
    cache.write(true, b, at, o.v_new.select(0, b));
  }

  AttentionResult result;
  result.out = Tensor::empty({B, L, Hq, Ev}, q.dtype());
  result.lse = Tensor::empty({B, Hq, L}, DType::kFloat32);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = cached[static_cast<size_t>(b)] + new_len;
    const AttentionResult r = calls[static_cast<size_t>(b)].forward(
        heads_first(q_run, b, L), cache.rows(false, b, n), cache.rows(true, b, n), cache.pages(b),
        cache.dequant());
    result.out.select(0, b).copy_(r.out.select(0, 0).transpose(0, 1));
    result.lse.select(0, b).copy_(r.lse.select(0, 0));
    result.backend = r.backend;
  }
  return result;
}

void append_paged_kv_cache(const Tensor& k_new, const Tensor& v_new, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& block_table,
                           const Tensor& positions, const Tensor& k_scale,
                           const Tensor& v_scale) {
  check_dims(k_new, "k_new", 4, "[B, L_new, Hkv, E]", "append_paged_kv_cache");
  SDPA_CHECK(block_table.defined(), "block_table: expected an int32 tensor [B, max_pages], got none");
  SDPA_CHECK(is_floating(k_new.dtype()), "k_new: expected float32, float64, bfloat16 or "
             "float16, got ", dtype_name(k_new.dtype()));
  const int64_t B = k_new.size(0);
  const serving::CacheLayout cache(k_cache, v_cache, block_table, B, k_new.dtype(), k_new.size(3),
                                   k_scale, v_scale);
  const int64_t new_len = check_new_rows(k_new, v_new, cache, B, k_new.dtype(),
                                         cache.dequant() ? "k_new's dtype" : "the cache's dtype",
                                         k_new.size(3));
  const std::vector<int64_t> at = read_positions(positions, "positions", B, cache.capacity(), new_len);
  for (int64_t b = 0; b < B; ++b) cache.check_pages(b, at[static_cast<size_t>(b)] + new_len);
  for (int64_t b = 0; b < B; ++b) {
    cache.write(false, b, at[static_cast<size_t>(b)], k_new.select(0, b));
    cache.write(true, b, at[static_cast<size_t>(b)], v_new.select(0, b));
  }
}

}  // namespace sdpa
