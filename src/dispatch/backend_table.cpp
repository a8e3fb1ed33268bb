// The backend table, the checks runner, and the helpers that run a built-in backend's
// kernels. Each backend's checks and kernels live with its code (backend_impl.h).

#include "dispatch/backend_impl.h"
#include "dispatch/lowering.h"

namespace sdpa::detail {
namespace {

const BackendImpl* const kBackends[] = {&kMathBackend, &kFlashCpuBackend, &kEfficientBackend,
                                        &kCudnnBackend, &kOverrideableBackend};

// Built-in kernels write host memory; tensors on other devices reach them only through
// the CPU fallback, which copies to host first.
void check_host(const AttentionParams& params, const BackendImpl& impl) {
  SDPA_CHECK(params.device.type == DeviceType::kCPU, backend_name(impl.id),
             ": expected tensors on cpu, got ", device_name(params.device));
}

}  // namespace

const BackendImpl& backend_impl(SDPBackend backend) {
  for (const BackendImpl* b : kBackends) {
    if (b->id == backend) return *b;
  }
  throw Error("backend: " + std::string(backend_name(backend)) + " has no implementation");
}

bool run_checks(const BackendImpl& impl, const AttentionParams& params, Reasons& reasons) {
  bool ok = true;
  for (const NamedCheck& check : impl.checks) {
    if (!check.fn(params, reasons)) {
      ok = false;
      if (!reasons.collect) break;
    }
  }
  return ok;
}

void forward_into(const BackendImpl& impl, const AttentionParams& params, const Tensor& out,
                  const Tensor& lse) {
  SDPA_CHECK(impl.forward != nullptr, backend_name(impl.id),
             " has no forward kernel in this build");
  check_host(params, impl);
  // No query row: out and lse have no element, and a kernel would still size its scratch
  // and loops by the keys (MATH took seconds and gigabytes for B = 0 beside 2^27 keys).
  if (params.batch * params.num_heads_q * params.q_len == 0) return;
  // Two calls, not a conditional expression: that would copy `params` (its tensors'
  // shapes included) on every call.
  if (impl.native_bias) {
    impl.forward(params, out, lse);
  } else {
    impl.forward(with_materialized_bias(params), out, lse);
  }
}

void backward_into(const BackendImpl& impl, const AttentionParams& params,
                   BackwardOutputs& outputs) {
  SDPA_CHECK(impl.backward != nullptr, backend_name(impl.id),
             " has no backward kernel in this build");
  check_host(params, impl);
  // No query row (and no score_mod, whose captured tensors' gradients the kernels size):
  // every gradient is zero or empty.
  if (params.batch * params.num_heads_q * params.q_len == 0 && !params.mask.score_mod) {
    for (Tensor* t : {&outputs.grad_q, &outputs.grad_k, &outputs.grad_v, &outputs.grad_mask}) {
      if (t->defined()) t->copy_(Tensor::zeros({1}, t->dtype()).expand(t->sizes()));
    }
    return;
  }
  if (impl.native_bias) {
    impl.backward(params, outputs);
  } else {
    impl.backward(with_materialized_bias(params), outputs);
  }
}

ForwardOutputs allocate_forward_outputs(const AttentionParams& p) {
  return {Tensor::empty({p.batch, p.num_heads_q, p.q_len, p.head_dim_vo}, p.dtype),
          Tensor::empty({p.batch, p.num_heads_q, p.q_len}, DType::kFloat32)};
}

BackwardOutputs allocate_backward_outputs(const AttentionParams& p) {
  BackwardOutputs outputs;
  outputs.grad_q = Tensor::empty(p.q.sizes(), p.dtype);
  outputs.grad_k = Tensor::empty(p.k.sizes(), p.dtype);
  outputs.grad_v = Tensor::empty(p.v.sizes(), p.dtype);
  if (p.attn_mask_requires_grad) {
    outputs.grad_mask = Tensor::empty({p.batch, p.num_heads_q, p.q_len, p.kv_len}, p.dtype);
  }
  return outputs;
}

}  // namespace sdpa::detail
