// The public backward entry point: validate, select (same checks as the forward, with
// params.backward set), run, and reduce the mask gradient to the mask's own shape.

#include "dispatch/backend_impl.h"
#include "dispatch/broadcast.h"
#include "dispatch/lowering.h"
#include "sdpa/cuda.h"
#include "sdpa/registry.h"
#include "sdpa/flex.h"

namespace sdpa {

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
          detail::sum_to_shape(cuda::to_device(grad_mask, Device{}, p.stream), attn_mask.sizes(),
                               attn_mask.dtype()),
          attn_mask.device(), p.stream);
    } else {
      g.grad_attn_mask = to_device(
          detail::sum_to_shape(to_host(grad_mask), attn_mask.sizes(), attn_mask.dtype()), attn_mask.device());
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
  if (!detail::needs_broadcast(q, k, v, options)) {
    return run_backward(make_backward_params(grad_out, q, k, v, out, lse, options),
                        options.attn_mask.tensor());
  }
  // Other ranks and broadcast k/v: grad_out, out and lse are shaped like q's outputs;
  // the gradients come back shaped like each input, summed over broadcast dimensions.
  const detail::BroadcastCall c = detail::broadcast_call(q, k, v, options);
  const Shape out_shape = c.out_shape(), lse_shape = c.lse_shape();
  SDPA_CHECK(grad_out.defined() && grad_out.sizes() == out_shape, "grad_out: expected shape ",
             shape_str(out_shape), ", got ", grad_out.defined() ? shape_str(grad_out.sizes()) : "none");
  SDPA_CHECK(out.defined() && out.sizes() == out_shape, "out: expected shape ",
             shape_str(out_shape), ", got ", out.defined() ? shape_str(out.sizes()) : "none");
  SDPA_CHECK(lse.defined() && lse.sizes() == lse_shape, "lse: expected shape ",
             shape_str(lse_shape), ", got ", lse.defined() ? shape_str(lse.sizes()) : "none");
  const Tensor g4 = detail::merge_batch_dims(grad_out, options.stream);
  const Tensor o4 = detail::merge_batch_dims(out, options.stream);
  const Tensor l4 = detail::merge_batch_dims(lse.unsqueeze(-1), options.stream).squeeze(3);
  AttentionGradients g =
      run_backward(make_backward_params(g4, c.q, c.k, c.v, o4, l4, c.options), Tensor());
  g.grad_q = g.grad_q.view(c.q_shape);
  g.grad_k = detail::reduce_gradient(g.grad_k, c.k_expanded, c.k_shape, options.stream);
  g.grad_v = detail::reduce_gradient(g.grad_v, c.v_expanded, c.v_shape, options.stream);
  return g;
}

}  // namespace sdpa
