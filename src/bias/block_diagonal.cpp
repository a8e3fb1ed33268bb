// BlockDiagonalBias (packed documents) and PaddedKeysBias (per-batch valid keys).

#include <algorithm>
#include <sstream>

#include "bias/materialize.h"
#include "sdpa/error.h"

namespace sdpa {
namespace {

void check_offsets(const std::vector<int64_t>& cu, const char* name) {
  SDPA_CHECK(cu.size() >= 2, "BlockDiagonalBias: expected ", name,
             " with at least 2 offsets (one document), got ", cu.size());
  SDPA_CHECK(cu.front() == 0, "BlockDiagonalBias: expected ", name, "[0] == 0, got ",
             cu.front());
  for (size_t d = 1; d < cu.size(); ++d) {
    SDPA_CHECK(cu[d] >= cu[d - 1], "BlockDiagonalBias: expected ", name,
               " to be non-decreasing, got ", cu[d - 1], " then ", cu[d], " at index ", d);
  }
}

std::vector<int64_t> cumulative(const std::vector<int64_t>& lengths, const char* name) {
  std::vector<int64_t> cu{0};
  for (int64_t n : lengths) {
    SDPA_CHECK(n >= 0, "BlockDiagonalBias: expected non-negative ", name, ", got ", n);
    cu.push_back(cu.back() + n);
  }
  return cu;
}

// Document containing position x of the offsets `cu` (the last one starting at or before x).
int64_t document_of(const std::vector<int64_t>& cu, int64_t x) {
  return std::upper_bound(cu.begin(), cu.end(), x) - cu.begin() - 1;
}

}  // namespace

BlockDiagonalBias::BlockDiagonalBias(std::vector<int64_t> cu_seqlens_q,
                                     std::vector<int64_t> cu_seqlens_kv, bool causal,
                                     DiagonalAlignment alignment)
    : cu_q_(std::move(cu_seqlens_q)), cu_kv_(std::move(cu_seqlens_kv)) {
  if (cu_kv_.empty()) cu_kv_ = cu_q_;
  check_offsets(cu_q_, "cu_seqlens_q");
  check_offsets(cu_kv_, "cu_seqlens_kv");
  SDPA_CHECK(cu_q_.size() == cu_kv_.size(), "BlockDiagonalBias: expected as many kv documents "
             "as q documents (", cu_q_.size() - 1, "), got ", cu_kv_.size() - 1);
  if (causal) band_ = DiagonalBand{alignment, std::nullopt, 0, BandFrame::kDocument};
}

std::shared_ptr<BlockDiagonalBias> BlockDiagonalBias::from_seqlens(
    const std::vector<int64_t>& q_seqlens, const std::vector<int64_t>& kv_seqlens, bool causal,
    DiagonalAlignment alignment) {
  return std::make_shared<BlockDiagonalBias>(
      cumulative(q_seqlens, "q_seqlens"),
      kv_seqlens.empty() ? std::vector<int64_t>{} : cumulative(kv_seqlens, "kv_seqlens"), causal,
      alignment);
}

Tensor BlockDiagonalBias::materialize(const BiasShape& shape, DType) const {
  bias_detail::check_fits(*this, shape);
  return bias_detail::bool_mask(1, shape.q_len, shape.kv_len, [&](int64_t, int64_t i, int64_t j) {
    if (i >= cu_q_.back() || j >= cu_kv_.back()) return false;
    const int64_t d = document_of(cu_q_, i);
    if (j < cu_kv_[d] || j >= cu_kv_[d + 1]) return false;
    return !band_ || bias_detail::in_band(*band_, i - cu_q_[d], j - cu_kv_[d],
                                          cu_q_[d + 1] - cu_q_[d], cu_kv_[d + 1] - cu_kv_[d]);
  });
}

void BlockDiagonalBias::lower(const BiasShape& shape, MaskDescriptor& mask) const {
  SDPA_CHECK(cu_q_.back() == shape.q_len, "attn_mask: BlockDiagonalBias documents cover ",
             cu_q_.back(), " query positions but the call has L=", shape.q_len);
  SDPA_CHECK(cu_kv_.back() == shape.kv_len, "attn_mask: BlockDiagonalBias documents cover ",
             cu_kv_.back(), " key positions but the call has S=", shape.kv_len);
  SDPA_CHECK(!mask.has_documents(), "attn_mask: expected at most one BlockDiagonalBias, got two");
  mask.cu_seqlens_q = cu_q_;
  mask.cu_seqlens_kv = cu_kv_;
  if (band_) mask.bands.push_back(*band_);
}

std::string BlockDiagonalBias::describe() const {
  std::ostringstream os;
  os << "block-diagonal (" << cu_q_.size() - 1 << " documents"
     << (band_ ? std::string(", causal ") + bias_detail::alignment_name(band_->alignment) : "")
     << ")";
  return os.str();
}

PaddedKeysBias::PaddedKeysBias(std::vector<int64_t> kv_lengths, bool causal)
    : kv_lengths_(std::move(kv_lengths)), causal_(causal) {
  SDPA_CHECK(!kv_lengths_.empty(), "PaddedKeysBias: expected one kv length per batch, got none");
  for (int64_t n : kv_lengths_) {
    SDPA_CHECK(n >= 0, "PaddedKeysBias: expected non-negative kv lengths, got ", n);
  }
}

Tensor PaddedKeysBias::materialize(const BiasShape& shape, DType) const {
  bias_detail::check_fits(*this, shape);
  const DiagonalBand causal{DiagonalAlignment::kBottomRight, std::nullopt, 0};
  return bias_detail::bool_mask(
      shape.batch, shape.q_len, shape.kv_len, [&](int64_t b, int64_t i, int64_t j) {
        return j < kv_lengths_[b] &&
               (!causal_ || bias_detail::in_band(causal, i, j, shape.q_len, kv_lengths_[b]));
      });
}

void PaddedKeysBias::lower(const BiasShape& shape, MaskDescriptor& mask) const {
  SDPA_CHECK(static_cast<int64_t>(kv_lengths_.size()) == shape.batch, "attn_mask: PaddedKeysBias "
             "has ", kv_lengths_.size(), " lengths but the call has batch ", shape.batch);
  for (int64_t n : kv_lengths_) {
    SDPA_CHECK(n <= shape.kv_len, "attn_mask: PaddedKeysBias length ", n,
               " exceeds the call's S=", shape.kv_len);
  }
  SDPA_CHECK(mask.kv_lengths.empty(), "attn_mask: expected at most one PaddedKeysBias, got two");
  mask.kv_lengths = kv_lengths_;
  if (causal_) {
    mask.bands.push_back({DiagonalAlignment::kBottomRight, std::nullopt, 0, BandFrame::kValidKeys});
  }
}

std::string PaddedKeysBias::describe() const {
  return "padded keys (" + std::to_string(kv_lengths_.size()) + " batch lengths" +
         (causal_ ? ", causal bottom-right)" : ")");
}

}  // namespace sdpa
