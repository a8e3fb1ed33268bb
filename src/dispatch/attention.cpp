// The public entry points: validate, select, run.

#include "dispatch/backend_impl.h"
#include "dispatch/lowering.h"

namespace sdpa {

AttentionResult run_forward(const AttentionParams& params) {
  AttentionResult result;
  result.backend = select_backend(params);
  result.out = Tensor::empty({params.batch, params.num_heads_q, params.q_len, params.head_dim_vo},
                             params.dtype);
  result.lse = Tensor::empty({params.batch, params.num_heads_q, params.q_len}, DType::kFloat32);
  result.philox = params.dropout.philox;
  const detail::BackendImpl& impl = detail::backend_impl(result.backend);
  impl.forward(impl.native_bias ? params : with_materialized_bias(params), result.out, result.lse);
  if (params.unbatched) {
    result.out = result.out.squeeze(0);
    result.lse = result.lse.squeeze(0);
  }
  return result;
}

AttentionResult scaled_dot_product_attention_with_lse(const Tensor& q, const Tensor& k,
                                                      const Tensor& v,
                                                      const SDPAOptions& options) {
  return run_forward(make_params(q, k, v, options));
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SDPAOptions& options) {
  return scaled_dot_product_attention_with_lse(q, k, v, options).out;
}

std::string version() { return SDPA_VERSION; }

}  // namespace sdpa
