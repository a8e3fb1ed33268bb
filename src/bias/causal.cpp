// CausalBias and LocalAttentionBias: diagonal bands in sequence coordinates.

#include <sstream>

#include "bias/materialize.h"
#include "sdpa/error.h"

namespace sdpa {
namespace {
DiagonalAlignment alignment_of(CausalVariant v) {
  return v == CausalVariant::UPPER_LEFT ? DiagonalAlignment::kTopLeft
                                        : DiagonalAlignment::kBottomRight;
}
}  // namespace

CausalBias::CausalBias(CausalVariant variant, int64_t q_len, int64_t kv_len)
    : variant_(variant), q_len_(q_len), kv_len_(kv_len) {
  SDPA_CHECK(q_len >= 0 && kv_len >= 0, "CausalBias: expected non-negative lengths, got L=",
             q_len, ", S=", kv_len);
}

Tensor CausalBias::materialize(const BiasShape& shape, DType) const {
  bias_detail::check_fits(*this, shape);
  const DiagonalBand band{alignment_of(variant_), std::nullopt, 0};
  return bias_detail::bool_mask(1, shape.q_len, shape.kv_len, [&](int64_t, int64_t i, int64_t j) {
    return bias_detail::in_band(band, i, j, shape.q_len, shape.kv_len);
  });
}

void CausalBias::lower(const BiasShape& shape, MaskDescriptor& mask) const {
  SDPA_CHECK(shape.q_len == q_len_ && shape.kv_len == kv_len_, "attn_mask: CausalBias was made "
             "for L=", q_len_, ", S=", kv_len_, " but the call has L=", shape.q_len, ", S=",
             shape.kv_len);
  mask.bands.push_back({alignment_of(variant_), std::nullopt, 0, BandFrame::kSequence});
}

std::string CausalBias::describe() const {
  std::ostringstream os;
  os << "causal " << (variant_ == CausalVariant::UPPER_LEFT ? "upper-left" : "lower-right")
     << " (L=" << q_len_ << ", S=" << kv_len_ << ")";
  return os.str();
}

std::shared_ptr<CausalBias> causal_upper_left(int64_t q_len, int64_t kv_len) {
  return std::make_shared<CausalBias>(CausalVariant::UPPER_LEFT, q_len, kv_len);
}

std::shared_ptr<CausalBias> causal_lower_right(int64_t q_len, int64_t kv_len) {
  return std::make_shared<CausalBias>(CausalVariant::LOWER_RIGHT, q_len, kv_len);
}

LocalAttentionBias::LocalAttentionBias(std::optional<int64_t> left, std::optional<int64_t> right,
                                       DiagonalAlignment alignment)
    : band_{alignment, left, right, BandFrame::kSequence} {
  SDPA_CHECK(!left || *left >= 0, "LocalAttentionBias: expected left window >= 0, got ", *left);
  SDPA_CHECK(!right || *right >= 0, "LocalAttentionBias: expected right window >= 0, got ",
             *right);
}

Tensor LocalAttentionBias::materialize(const BiasShape& shape, DType) const {
  return bias_detail::bool_mask(1, shape.q_len, shape.kv_len, [&](int64_t, int64_t i, int64_t j) {
    return bias_detail::in_band(band_, i, j, shape.q_len, shape.kv_len);
  });
}

void LocalAttentionBias::lower(const BiasShape&, MaskDescriptor& mask) const {
  mask.bands.push_back(band_);
}

std::string LocalAttentionBias::describe() const {
  std::ostringstream os;
  os << "local window (left=" << (band_.left ? std::to_string(*band_.left) : "inf")
     << ", right=" << (band_.right ? std::to_string(*band_.right) : "inf") << ", "
     << bias_detail::alignment_name(band_.alignment) << ")";
  return os.str();
}

}  // namespace sdpa
