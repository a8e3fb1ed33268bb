// AttnBias base, AttnMask and TensorBias (the dense path).

#include "sdpa/attn_bias.h"

#include "sdpa/error.h"

namespace sdpa {

void AttnBias::lower(const BiasShape&, MaskDescriptor&) const {
  throw Error("attn_mask: " + describe() + " has no native form; use materialize()");
}

AttnMask::AttnMask(Tensor mask)
    : bias_(mask.defined() ? std::make_shared<TensorBias>(std::move(mask)) : nullptr) {}

Tensor AttnMask::tensor() const {
  const auto* t = dynamic_cast<const TensorBias*>(bias_.get());
  return t ? t->tensor() : Tensor();
}

TensorBias::TensorBias(Tensor mask) : mask_(std::move(mask)) {
  SDPA_CHECK(mask_.defined(), "attn_mask: expected a tensor, got an undefined one");
}

Tensor TensorBias::materialize(const BiasShape&, DType) const { return mask_; }

void TensorBias::lower(const BiasShape& shape, MaskDescriptor& mask) const {
  SDPA_CHECK(mask.dense_kind == DenseMaskKind::kNone,
             "attn_mask: expected at most one dense mask tensor in a composition, got two");
  const Shape want = shape.scores();
  bool ok = mask_.dim() <= 4;
  for (int64_t i = 0; ok && i < mask_.dim(); ++i) {
    const int64_t have = mask_.size(mask_.dim() - 1 - i);
    ok = have == want[3 - i] || have == 1;
  }
  SDPA_CHECK(ok, "attn_mask: expected a shape broadcastable to ", shape_str(want), ", got ",
             shape_str(mask_.sizes()));
  mask.dense = mask_.expand(want);
  mask.dense_kind = mask_.dtype() == DType::kBool ? DenseMaskKind::kBoolKeep
                                                  : DenseMaskKind::kAdditive;
}

std::string TensorBias::describe() const { return "tensor " + mask_.describe(); }

}  // namespace sdpa
