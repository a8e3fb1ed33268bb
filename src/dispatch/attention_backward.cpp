// The public backward entry point: validate, select (same checks as the forward, with
// params.backward set), run, and reduce the mask gradient to the mask's own shape.

#include <vector>

#include "core/element_access.h"
#include "dispatch/backend_impl.h"
#include "dispatch/lowering.h"
#include "sdpa/cuda.h"
#include "sdpa/registry.h"
#include "sdpa/flex.h"

namespace sdpa {
namespace {

// Sums full [B, Hq, L, S] gradients over the dimensions the mask was broadcast along
// (autograd's rule for broadcasting), returning a tensor of the mask's shape and dtype.
Tensor sum_to_mask_shape(const Tensor& full, const Tensor& mask) {
  const Shape& shape = mask.sizes();
  const int64_t lead = full.dim() - mask.dim();
  std::vector<double> sums(static_cast<size_t>(checked_numel(shape)), 0.0);
  const Shape mask_strides = contiguous_strides(shape);
  const int64_t n = full.numel();
  const Shape full_shape = full.sizes();
  Shape index(full.dim(), 0);
  const auto* data = full.data<char>();
  for (int64_t linear = 0; linear < n; ++linear) {
    int64_t target = 0;
    for (int64_t d = 0; d < mask.dim(); ++d) {
      if (shape[d] != 1) target += index[lead + d] * mask_strides[d];
    }
    sums[target] += detail::load_element(data, full.dtype(), linear);
    for (int64_t d = full.dim() - 1; d >= 0; --d) {
      if (++index[d] < full_shape[d]) break;
      index[d] = 0;
    }
  }
  Tensor out = Tensor::empty(shape, mask.dtype());
  for (size_t i = 0; i < sums.size(); ++i) {
    detail::store_element(out.data_ptr(), out.dtype(), static_cast<int64_t>(i), sums[i]);
  }
  return out;
}

}  // namespace

// As run_forward: built-in backends write into gradients allocated here, OVERRIDEABLE
// runs through the operator registry.
AttentionGradients run_backward(const AttentionParams& p, const Tensor& attn_mask) {
  const detail::BackendImpl& impl = detail::backend_impl(select_backend(p));
  SDPBackend ran = impl.id;
  detail::BackwardOutputs outputs;
  if (impl.external_backward != nullptr) {
    outputs = impl.external_backward(p, ran);
  } else {
    outputs = detail::allocate_backward_outputs(p);
    detail::backward_into(impl, p, outputs);
  }
  AttentionGradients g;
  g.backend = ran;
  auto drop_batch = [&](const Tensor& t) { return p.unbatched ? t.squeeze(0) : t; };
  g.grad_q = drop_batch(outputs.grad_q);
  g.grad_k = drop_batch(outputs.grad_k);
  g.grad_v = drop_batch(outputs.grad_v);
  if (p.attn_mask_requires_grad) {
    // The reduction reads host memory; a device's gradient goes there and back.
    const Tensor grad_mask = drop_batch(outputs.grad_mask);
    if (p.device.type == DeviceType::kCUDA) {
      g.grad_attn_mask = cuda::to_device(
          sum_to_mask_shape(cuda::to_device(grad_mask, Device{}, p.stream), attn_mask),
          attn_mask.device(), p.stream);
    } else {
      g.grad_attn_mask = to_device(
          sum_to_mask_shape(to_host(grad_mask), attn_mask), attn_mask.device());
    }
  }
  g.grad_captured = std::move(outputs.grad_captured);
  // One entry per captured tensor of the score_mod, undefined where none was computed
  // (the kernels return none at all when no captured tensor requires grad).
  if (p.mask.score_mod && g.grad_captured.empty()) {
    g.grad_captured.resize(p.mask.score_mod->captured().size());
  }
  return g;
}

AttentionGradients scaled_dot_product_attention_backward(const Tensor& grad_out,
                                                         const Tensor& q, const Tensor& k,
                                                         const Tensor& v, const Tensor& out,
                                                         const Tensor& lse,
                                                         const SDPAOptions& options) {
  return run_backward(make_backward_params(grad_out, q, k, v, out, lse, options),
                      options.attn_mask.tensor());
}

}  // namespace sdpa
