// The public entry points: validate, select, run through the registry.

#include "dispatch/backend_impl.h"
#include "dispatch/lowering.h"
#include "registry/registry_impl.h"

namespace sdpa {

// The `attention` op of the registry (src/registry) on the params' device: for CPU tensors
// the selected backend's kernel, for an external device its plugin's kernel (or the CPU
// fallback).
AttentionResult run_forward(const AttentionParams& params) {
  OpCall call;
  call.params = &params;
  call.backend = select_backend(params);
  registry::call(registry::OpId::kAttention, call);
  AttentionResult result;
  result.backend = call.backend;
  result.out = std::move(call.returns.at(0));
  result.lse = std::move(call.returns.at(1));
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
  return run_forward(make_params(q, k, v, options));
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SDPAOptions& options) {
  return scaled_dot_product_attention_with_lse(q, k, v, options).out;
}

std::string version() { return SDPA_VERSION; }

}  // namespace sdpa
