#include "bias/materialize.h"

#include "core/element_access.h"
#include "core/saturating.h"

namespace sdpa::bias_detail {

Tensor bool_mask(int64_t batch, int64_t q_len, int64_t kv_len,
                 const std::function<bool(int64_t, int64_t, int64_t)>& keep) {
  Tensor t = Tensor::empty({batch, 1, q_len, kv_len}, DType::kBool);
  bool* d = t.data<bool>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t j = 0; j < kv_len; ++j) *d++ = keep(b, i, j);
    }
  }
  return t;
}

Tensor additive_bias(int64_t num_heads, int64_t q_len, int64_t kv_len, DType dtype,
                     const std::function<double(int64_t, int64_t, int64_t)>& value) {
  Tensor t = Tensor::empty({1, num_heads, q_len, kv_len}, dtype);
  int64_t n = 0;
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t j = 0; j < kv_len; ++j) {
        detail::store_element(t.data_ptr(), dtype, n++, value(h, i, j));
      }
    }
  }
  return t;
}

const char* alignment_name(DiagonalAlignment alignment) {
  return alignment == DiagonalAlignment::kTopLeft ? "top-left" : "bottom-right";
}

bool in_band(const DiagonalBand& band, int64_t i, int64_t j, int64_t q_len, int64_t kv_len) {
  const int64_t d = band.alignment == DiagonalAlignment::kBottomRight ? kv_len - q_len : 0;
  const int64_t diag = i + d;  // within (-2^63, 2^63): i < q_len, |d| < max(q_len, kv_len)
  if (band.left && j < detail::saturating_sub(diag, *band.left)) return false;
  if (band.right && j > detail::saturating_add(diag, *band.right)) return false;
  return true;
}

}  // namespace sdpa::bias_detail
