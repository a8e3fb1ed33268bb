// ComposedBias: masks intersect, additive terms add.

#include <cmath>
#include <limits>

#include "core/element_access.h"
#include "sdpa/attn_bias.h"
#include "sdpa/error.h"

namespace sdpa {

ComposedBias::ComposedBias(std::vector<AttnBiasPtr> parts) : parts_(std::move(parts)) {
  SDPA_CHECK(!parts_.empty(), "ComposedBias: expected at least one bias, got none");
  for (const AttnBiasPtr& p : parts_) {
    SDPA_CHECK(p != nullptr, "ComposedBias: expected non-null biases, got a null one");
  }
}

bool ComposedBias::needs_materialization() const {
  for (const AttnBiasPtr& p : parts_) {
    if (p->needs_materialization()) return true;
  }
  return false;
}

void ComposedBias::lower(const BiasShape& shape, MaskDescriptor& mask) const {
  for (const AttnBiasPtr& p : parts_) p->lower(shape, mask);
}

Tensor ComposedBias::materialize(const BiasShape& shape, DType dtype) const {
  std::vector<Tensor> dense;
  bool any_float = false;
  for (const AttnBiasPtr& p : parts_) {
    dense.push_back(p->materialize(shape, dtype).expand(shape.scores()));
    any_float = any_float || dense.back().dtype() != DType::kBool;
  }
  const Shape full = shape.scores();
  Tensor out = Tensor::empty(full, any_float ? dtype : DType::kBool);
  const int64_t n = out.numel();
  Shape index(4, 0);
  for (int64_t linear = 0; linear < n; ++linear) {
    double value = 0.0;
    bool keep = true;
    for (const Tensor& t : dense) {
      int64_t off = 0;
      for (int d = 0; d < 4; ++d) off += index[d] * t.stride(d);
      const double x = detail::load_element(t.data_ptr(), t.dtype(), off);
      if (t.dtype() == DType::kBool) {
        keep = keep && x != 0.0;
      } else {
        value += x;
      }
    }
    const double stored = any_float ? (keep ? value : -std::numeric_limits<double>::infinity())
                                    : (keep ? 1.0 : 0.0);
    detail::store_element(out.data_ptr(), out.dtype(), linear, stored);
    for (int d = 3; d >= 0; --d) {
      if (++index[d] < full[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

std::string ComposedBias::describe() const {
  std::string s = "composed [";
  for (size_t i = 0; i < parts_.size(); ++i) s += (i ? " + " : "") + parts_[i]->describe();
  return s + "]";
}

std::shared_ptr<ComposedBias> compose(std::vector<AttnBiasPtr> parts) {
  return std::make_shared<ComposedBias>(std::move(parts));
}

}  // namespace sdpa
