#include "flex/captured_grads.h"

#include "core/element_access.h"

namespace sdpa::flex {

CapturedGrads::CapturedGrads(const GradientProgram& grad,
                             const std::vector<Captured>& forward_captured, int64_t chunks)
    : grad_(&grad), forward_(&forward_captured), chunks_(chunks),
      slot_offset_(forward_captured.size(), -1) {
  for (const GradientProgram::ReadGrad& r : grad.reads) {
    if (slot_offset_[r.forward_slot] >= 0) continue;
    slot_offset_[r.forward_slot] = chunk_size_;
    chunk_size_ += forward_captured[r.forward_slot].tensor().numel();
  }
  partial_.assign(static_cast<size_t>(chunks_ * chunk_size_), 0.0);
}

void CapturedGrads::add(int64_t chunk, size_t read, const int64_t* index, double value) {
  const GradientProgram::ReadGrad& r = grad_->reads[read];
  const Tensor& t = (*forward_)[r.forward_slot].tensor();
  int64_t linear = 0;
  for (int64_t d = 0; d < t.dim(); ++d) linear = linear * t.size(d) + index[d];
  partial_[chunk * chunk_size_ + slot_offset_[r.forward_slot] + linear] += value;
}

std::vector<Tensor> CapturedGrads::finish() const {
  std::vector<Tensor> out(forward_->size());
  for (size_t s = 0; s < forward_->size(); ++s) {
    if (slot_offset_[s] < 0) continue;
    const Tensor& t = (*forward_)[s].tensor();
    Tensor g = Tensor::empty(t.sizes(), t.dtype());
    const int64_t n = t.numel();
    for (int64_t e = 0; e < n; ++e) {
      double sum = 0.0;
      for (int64_t c = 0; c < chunks_; ++c) sum += partial_[c * chunk_size_ + slot_offset_[s] + e];
      detail::store_element(g.data_ptr(), g.dtype(), e, sum);
    }
    out[s] = std::move(g);
  }
  return out;
}

}  // namespace sdpa::flex
