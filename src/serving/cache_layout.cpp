#include "serving/cache_layout.h"

#include <cmath>
#include <string>
#include <vector>

#include "sdpa/error.h"

namespace sdpa::serving {
void check_dims(const Tensor& t, const char* name, int64_t dims, const char* layout,
                const char* entry) {
  SDPA_CHECK(t.defined(), name, ": expected a tensor ", layout, ", got none");
  SDPA_CHECK(t.dim() == dims, name, ": expected a ", dims, "-D tensor ", layout, ", got ",
             shape_str(t.sizes()));
  SDPA_CHECK(t.device() == Device{}, name, ": ", entry, " takes CPU tensors, got ",
             device_name(t.device()));
}

void check_size(const Tensor& t, const char* name, int64_t dim, int64_t expected,
                const char* what) {
  SDPA_CHECK(t.size(dim) == expected, name, ": expected ", what, " = ", expected,
             " (dimension ", dim, "), got ", t.size(dim), " in ", shape_str(t.sizes()));
}


namespace {

// The scales of a float8 cache with `heads` kv heads: `scale` float32 [] or [heads], each
// finite and > 0; all 1 when undefined.
std::vector<float> read_scales(const Tensor& scale, const char* name, int64_t heads) {
  if (!scale.defined()) return std::vector<float>(static_cast<size_t>(heads), 1.0f);
  SDPA_CHECK(scale.dtype() == DType::kFloat32 && scale.device() == Device{} &&
                 (scale.dim() == 0 || (scale.dim() == 1 && scale.size(0) == heads)),
             name, ": expected a CPU float32 tensor [] or [Hkv = ", heads, "], got ",
             scale.describe());
  std::vector<float> out(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    const double s = scale.dim() == 0 ? scale.item({}) : scale.item({h});
    SDPA_CHECK(std::isfinite(s) && s > 0.0, name, "[", h, "] = ", s,
               ": expected a finite scale > 0");
    out[static_cast<size_t>(h)] = static_cast<float>(s);
  }
  return out;
}

}  // namespace

CacheLayout::CacheLayout(const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_table,
                         int64_t batch, DType dtype, int64_t head_dim, const Tensor& k_scale,
                         const Tensor& v_scale)
    : k_cache_(k_cache), v_cache_(v_cache) {
  const bool paged = block_table.defined();
  const char* k_layout = paged ? "[num_pages, page_size, Hkv, E]" : "[B, S_max, Hkv, E]";
  const char* v_layout = paged ? "[num_pages, page_size, Hkv, Ev]" : "[B, S_max, Hkv, Ev]";
  check_dims(k_cache, "k_cache", 4, k_layout);
  check_dims(v_cache, "v_cache", 4, v_layout);
  kv_heads_ = k_cache.size(2);
  value_dim_ = v_cache.size(3);
  const bool float8 = k_cache.dtype() == DType::kFloat8E4M3FN;
  for (const auto& [t, name] : {std::pair{&k_cache, "k_cache"}, std::pair{&v_cache, "v_cache"}}) {
    SDPA_CHECK(t->dtype() == (float8 ? DType::kFloat8E4M3FN : dtype), name, ": expected q's dtype ",
               dtype_name(dtype), " or float8_e4m3fn (k_cache and v_cache alike), got ",
               dtype_name(t->dtype()));
    if (paged) {
      check_size(*t, name, 0, k_cache.size(0), "num_pages of k_cache");
      check_size(*t, name, 1, k_cache.size(1), "page_size of k_cache");
    } else {
      check_size(*t, name, 0, batch, "the batch size B of q");
      check_size(*t, name, 1, k_cache.size(1), "the capacity S_max of k_cache");
    }
    check_size(*t, name, 2, kv_heads_, "the kv head count Hkv of k_cache");
  }
  check_size(k_cache, "k_cache", 3, head_dim, "the head dimension E of q");
  if (float8) {
    auto dequant = std::make_shared<KvDequant>();
    dequant->k_scale = read_scales(k_scale, "k_scale", kv_heads_);
    dequant->v_scale = read_scales(v_scale, "v_scale", kv_heads_);
    dequant_ = std::move(dequant);
  } else {
    for (const auto& [t, name] : {std::pair{&k_scale, "k_scale"}, std::pair{&v_scale, "v_scale"}}) {
      SDPA_CHECK(!t->defined(), name, ": only float8_e4m3fn caches take scales, got a ",
                 dtype_name(k_cache.dtype()), " cache");
    }
  }
  if (!paged) {
    capacity_ = k_cache.size(1);
    return;
  }
  SDPA_CHECK(block_table.dtype() == DType::kInt32 && block_table.dim() == 2 &&
                 block_table.size(0) == batch,
             "block_table: expected an int32 tensor [B = ", batch, ", max_pages], got ",
             dtype_name(block_table.dtype()), " ", shape_str(block_table.sizes()));
  SDPA_CHECK(block_table.device() == Device{}, "block_table: expected a CPU tensor, got ",
             device_name(block_table.device()));
  const int64_t page_size = k_cache.size(1);
  SDPA_CHECK(page_size >= 1, "k_cache: expected page_size >= 1, got 0");
  auto pages = std::make_shared<KvPages>();
  pages->block_table = block_table.contiguous();
  pages->page_size = page_size;
  pages->k_page_stride = k_cache.stride(0);
  pages->v_page_stride = v_cache.stride(0);
  pages->k_pool = k_cache;
  pages->v_pool = v_cache;
  capacity_ = block_table.size(1) * page_size;
  pages_ = std::move(pages);
}

void CacheLayout::check_pages(int64_t b, int64_t n) const {
  if (!pages_) return;
  const int32_t* table = pages_->block_table.data<int32_t>() + b * pages_->block_table.size(1);
  const int64_t num_pages = k_cache_.size(0);
  for (int64_t i = 0; i * pages_->page_size < n; ++i) {
    SDPA_CHECK(table[i] >= 0 && table[i] < num_pages, "block_table[", b, "][", i, "] = ",
               table[i], " is outside the cache's ", num_pages, " pages (it holds positions ",
               i * pages_->page_size, "... of sequence ", b, ")");
  }
}

std::shared_ptr<const KvPages> CacheLayout::pages(int64_t b) const {
  if (!pages_) return nullptr;
  auto sequence = std::make_shared<KvPages>(*pages_);
  sequence->block_table = pages_->block_table.slice(0, b, b + 1);
  return sequence;
}

Tensor CacheLayout::rows(bool values, int64_t b, int64_t n) const {
  const Tensor& cache = values ? v_cache_ : k_cache_;
  if (!pages_) return cache.select(0, b).slice(0, 0, n).transpose(0, 1).unsqueeze(0);
  // Rows within a page only: the kernels find each row's page through the table. The
  // first page's address is a valid base even for rows the table places elsewhere.
  return Tensor::from_blob(cache.data_ptr(), {1, kv_heads_, n, cache.size(3)},
                           {0, cache.stride(2), cache.stride(1), cache.stride(3)},
                           cache.dtype());
}

void CacheLayout::write(bool values, int64_t b, int64_t at, const Tensor& rows) const {
  const Tensor& cache = values ? v_cache_ : k_cache_;
  // Position i's destination row [Hkv, D].
  const auto destination = [&](int64_t position) {
    if (!pages_) return cache.select(0, b).select(0, position);
    const int32_t* table = pages_->block_table.data<int32_t>() + b * pages_->block_table.size(1);
    const int64_t page_size = pages_->page_size;
    return cache.select(0, table[position / page_size]).select(0, position % page_size);
  };
  if (!dequant_) {
    if (!pages_) {
      cache.select(0, b).slice(0, at, at + rows.size(0)).copy_(rows);
      return;
    }
    for (int64_t i = 0; i < rows.size(0); ++i) destination(at + i).copy_(rows.select(0, i));
    return;
  }
  const std::vector<float>& scale = values ? dequant_->v_scale : dequant_->k_scale;
  const int64_t dim = cache.size(3);
  for (int64_t i = 0; i < rows.size(0); ++i) {
    const Tensor dst = destination(at + i);
    for (int64_t h = 0; h < kv_heads_; ++h) {
      auto* out = static_cast<float8_e4m3fn*>(dst.data_ptr()) + h * dst.stride(0);
      for (int64_t e = 0; e < dim; ++e) {
        const double x = rows.item({i, h, e});
        out[e * dst.stride(1)] =
            float8_e4m3fn(static_cast<float>(x / scale[static_cast<size_t>(h)]));
      }
    }
  }
}

}  // namespace sdpa::serving
