// The public forward entry points: validate, select, run the selected backend's kernel.

#include "dispatch/backend_impl.h"
#include "dispatch/broadcast.h"
#include "dispatch/lowering.h"

namespace sdpa {

// Built-in backends write into outputs allocated here; OVERRIDEABLE runs through the
// operator registry, which allocates on the external device.
AttentionResult run_forward(const AttentionParams& params) {
  const detail::BackendImpl& impl = detail::backend_impl(select_backend(params));
  SDPBackend ran = impl.id;
  detail::ForwardOutputs outputs;
  if (impl.external_forward != nullptr) {
    outputs = impl.external_forward(params, ran);
  } else {
    outputs = detail::allocate_forward_outputs(params);
    detail::forward_into(impl, params, outputs.out, outputs.lse);
  }
  AttentionResult result;
  result.backend = ran;
  result.out = std::move(outputs.out);
  result.lse = std::move(outputs.lse);
  result.philox = params.dropout.philox;
  if (params.unbatched) {
    result.out = result.out.squeeze(0);
    result.lse = result.lse.squeeze(0);
  }
  return result;
}

AttentionResult scaled_dot_product_attention_with_lse(const Tensor& q, const Tensor& k,
                                                      const Tensor& v,
                                                      const SDPAOptions& options) {
  if (!detail::needs_broadcast(q, k, v, options)) return run_forward(make_params(q, k, v, options));
  // Other ranks and broadcast k/v: a 4-D call on views, results shaped like q.
  const detail::BroadcastCall c = detail::broadcast_call(q, k, v, options);
  AttentionResult r = run_forward(make_params(c.q, c.k, c.v, c.options));
  r.out = r.out.view(c.out_shape());
  r.lse = r.lse.view(c.lse_shape());
  return r;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SDPAOptions& options) {
  return scaled_dot_product_attention_with_lse(q, k, v, options).out;
}

std::string version() { return SDPA_VERSION; }

}  // namespace sdpa
