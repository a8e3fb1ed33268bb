// AlibiBias: per-head linear position bias (Press et al., ICLR 2022).

#include <cmath>
#include <sstream>

#include "bias/materialize.h"
#include "sdpa/error.h"

namespace sdpa {

std::vector<float> alibi_slopes(int64_t num_heads) {
  SDPA_CHECK(num_heads >= 1 && num_heads <= kMaxAlibiHeads, "AlibiBias: expected num_heads in "
             "[1, ", kMaxAlibiHeads, "], got ", num_heads);
  // Geometric sequence starting at 2^(-8/n) with that ratio, for n a power of two. For
  // other n the paper takes the slopes of the closest smaller power of two m, then every
  // other slope of 2m for the remaining heads.
  auto power_of_two_slopes = [](int64_t n) {
    std::vector<float> s(n);
    const double start = std::pow(2.0, -8.0 / static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) s[i] = static_cast<float>(std::pow(start, i + 1));
    return s;
  };
  int64_t m = 1;
  while (m * 2 <= num_heads) m *= 2;
  std::vector<float> slopes = power_of_two_slopes(m);
  const std::vector<float> extra = power_of_two_slopes(2 * m);
  for (int64_t i = 0; static_cast<int64_t>(slopes.size()) < num_heads; i += 2) {
    slopes.push_back(extra[i]);
  }
  return slopes;
}

AlibiBias::AlibiBias(int64_t num_heads, DiagonalAlignment alignment)
    : AlibiBias(alibi_slopes(num_heads), alignment) {}

AlibiBias::AlibiBias(std::vector<float> slopes, DiagonalAlignment alignment)
    : slopes_(std::move(slopes)), alignment_(alignment) {
  SDPA_CHECK(!slopes_.empty(), "AlibiBias: expected at least one slope, got none");
  for (float s : slopes_) {
    SDPA_CHECK(std::isfinite(s), "AlibiBias: expected finite slopes, got ", s);
  }
}

Tensor AlibiBias::materialize(const BiasShape& shape, DType dtype) const {
  bias_detail::check_fits(*this, shape);
  const int64_t d = alignment_ == DiagonalAlignment::kBottomRight ? shape.kv_len - shape.q_len : 0;
  return bias_detail::additive_bias(
      shape.num_heads_q, shape.q_len, shape.kv_len, dtype, [&](int64_t h, int64_t i, int64_t j) {
        return -static_cast<double>(slopes_[h]) * static_cast<double>(std::abs(i + d - j));
      });
}

void AlibiBias::lower(const BiasShape& shape, MaskDescriptor& mask) const {
  SDPA_CHECK(static_cast<int64_t>(slopes_.size()) == shape.num_heads_q, "attn_mask: AlibiBias "
             "has ", slopes_.size(), " slopes but the call has ", shape.num_heads_q,
             " query heads");
  SDPA_CHECK(mask.alibi_slopes.empty(), "attn_mask: expected at most one AlibiBias, got two");
  mask.alibi_slopes = slopes_;
  mask.alibi_alignment = alignment_;
}

std::string AlibiBias::describe() const {
  std::ostringstream os;
  os << "ALiBi (" << slopes_.size() << " heads, " << bias_detail::alignment_name(alignment_)
     << ")";
  return os.str();
}

}  // namespace sdpa
