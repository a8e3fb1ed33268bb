// Rotary position embedding (RoPE; Su et al., "RoFormer", 2021) applied in place, in
// float32 as flash-attn's rotary kernels compute it.

#include <cstdint>
#include <vector>

#include "sdpa/error.h"
#include "sdpa/kv_cache.h"

namespace sdpa {

void apply_rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin,
                            const std::vector<int64_t>& positions, int64_t position_step,
                            bool interleaved) {
  SDPA_CHECK(x.dim() == 4, "rotary x: expected a 4-D tensor [B, L, H, E], got ",
             shape_str(x.sizes()));
  SDPA_CHECK(cos.dim() == 2 && sin.dim() == 2 && cos.sizes() == sin.sizes(),
             "rotary_cos / rotary_sin: expected two 2-D tables [max_positions, rotary_dim / 2] "
             "of one shape, got ", shape_str(cos.sizes()), " and ", shape_str(sin.sizes()));
  SDPA_CHECK(is_floating(cos.dtype()) && is_floating(sin.dtype()),
             "rotary_cos / rotary_sin: expected floating-point tables, got ",
             dtype_name(cos.dtype()), " and ", dtype_name(sin.dtype()));
  SDPA_CHECK(is_floating(x.dtype()), "rotary x: expected a floating-point tensor, got ",
             dtype_name(x.dtype()));
  SDPA_CHECK(x.device() == Device{} && cos.device() == Device{} && sin.device() == Device{},
             "rotary embedding: expected CPU tensors, got x on ", device_name(x.device()),
             ", tables on ", device_name(cos.device()));
  const int64_t B = x.size(0), L = x.size(1), H = x.size(2), E = x.size(3);
  const int64_t half = cos.size(1), table_rows = cos.size(0);
  SDPA_CHECK(half >= 1 && 2 * half <= E, "rotary_cos: rotary_dim = 2 * ", half,
             " must be between 2 and the head dimension ", E);
  SDPA_CHECK(static_cast<int64_t>(positions.size()) == B, "rotary positions: expected ", B,
             " (one per sequence), got ", positions.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = positions[static_cast<size_t>(b)];
    const int64_t last = L == 0 ? first : first + (L - 1) * position_step;
    SDPA_CHECK(first >= 0 && last < table_rows, "rotary_cos: sequence ", b,
               " needs positions [", first, ", ", last, "] but the tables hold ", table_rows,
               " positions");
  }
  if (x.numel() == 0) return;
  const Tensor c = cos.to(DType::kFloat32), s = sin.to(DType::kFloat32);
  Tensor rotated = x.to(DType::kFloat32);  // contiguous [B, L, H, E]
  float* data = rotated.data<float>();
  // Pair d of a row: (x[d], x[d + half]) in GPT-NeoX's layout, (x[2d], x[2d + 1]) in GPT-J's.
  const int64_t second = interleaved ? 1 : half, stride = interleaved ? 2 : 1;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < L; ++i) {
      const int64_t position = positions[static_cast<size_t>(b)] + i * position_step;
      const float* cos_row = c.data<float>() + position * half;
      const float* sin_row = s.data<float>() + position * half;
      for (int64_t h = 0; h < H; ++h) {
        float* row = data + ((b * L + i) * H + h) * E;
        for (int64_t d = 0; d < half; ++d) {
          float& x1 = row[d * stride];
          float& x2 = row[d * stride + second];
          const float a = x1, z = x2;
          x1 = a * cos_row[d] - z * sin_row[d];
          x2 = z * cos_row[d] + a * sin_row[d];
        }
      }
    }
  }
  Tensor(x).copy_(rotated);
}

}  // namespace sdpa
