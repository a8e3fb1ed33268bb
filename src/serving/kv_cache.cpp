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


// The valid cache lengths, checked against the capacity left for `new_len` keys.
std::vector<int64_t> read_seqlens(const Tensor& cache_seqlens, int64_t batch, int64_t capacity,
                                  int64_t new_len) {
  SDPA_CHECK(cache_seqlens.defined() && cache_seqlens.dtype() == DType::kInt32,
             "cache_seqlens: expected an int32 tensor [B], got ",
             cache_seqlens.defined() ? std::string(dtype_name(cache_seqlens.dtype())) : "none");
  SDPA_CHECK(cache_seqlens.dim() == 1 && cache_seqlens.size(0) == batch,
             "cache_seqlens: expected shape [", batch, "], got ", shape_str(cache_seqlens.sizes()));
  SDPA_CHECK(cache_seqlens.device() == Device{}, "cache_seqlens: expected a CPU tensor, got ",
             device_name(cache_seqlens.device()));
  std::vector<int64_t> lengths(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = static_cast<int64_t>(cache_seqlens.item({b}));
    SDPA_CHECK(n >= 0, "cache_seqlens[", b, "] = ", n, " is negative");
    SDPA_CHECK(n <= capacity - new_len, "cache_seqlens[", b, "] = ", n, " with ", new_len,
               " new keys exceeds the cache's capacity of ", capacity, " positions");
    lengths[static_cast<size_t>(b)] = n;
  }
  return lengths;
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
  const serving::CacheLayout cache(k_cache, v_cache, o.block_table, B, q.dtype(), E);
  const int64_t Hkv = cache.kv_heads(), Ev = cache.value_dim();
  SDPA_CHECK(Hkv > 0 && Hq % Hkv == 0, "q: the query head count ", Hq,
             " must be a multiple of the cache's kv head count ", Hkv, " (GQA)");
  SDPA_CHECK(o.k_new.defined() == o.v_new.defined(),
             "k_new / v_new: expected both or neither, got only ",
             o.k_new.defined() ? "k_new" : "v_new");
  int64_t new_len = 0;
  if (o.k_new.defined()) {
    check_dims(o.k_new, "k_new", 4, "[B, L_new, Hkv, E]");
    check_dims(o.v_new, "v_new", 4, "[B, L_new, Hkv, Ev]");
    new_len = o.k_new.size(1);
    const std::pair<const Tensor*, const char*> news[] = {{&o.k_new, "k_new"},
                                                          {&o.v_new, "v_new"}};
    for (const auto& [t, name] : news) {
      SDPA_CHECK(t->dtype() == q.dtype(), name, ": expected q's dtype ", dtype_name(q.dtype()),
                 ", got ", dtype_name(t->dtype()));
      check_size(*t, name, 0, B, "the batch size B of q");
      check_size(*t, name, 1, new_len, "L_new of k_new");
      check_size(*t, name, 2, Hkv, "the cache's kv head count Hkv");
    }
    check_size(o.k_new, "k_new", 3, E, "the head dimension E");
    check_size(o.v_new, "v_new", 3, Ev, "the value head dimension Ev of v_cache");
  }
  const std::vector<int64_t> cached = read_seqlens(cache_seqlens, B, cache.capacity(), new_len);
  for (int64_t b = 0; b < B; ++b) cache.check_pages(b, cached[static_cast<size_t>(b)] + new_len);
  serving::check_sequence_options(o, Hq);
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
    calls.back().check(heads_first(q_run, b, L), cache.rows(false, b, n), cache.rows(true, b, n));
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
        heads_first(q_run, b, L), cache.rows(false, b, n), cache.rows(true, b, n), cache.pages(b));
    result.out.select(0, b).copy_(r.out.select(0, 0).transpose(0, 1));
    result.lse.select(0, b).copy_(r.lse.select(0, 0));
    result.backend = r.backend;
  }
  return result;
}

}  // namespace sdpa
