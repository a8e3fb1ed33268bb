// The backend table, the checks runner, and the helpers that run a built-in backend's
// kernels. Each backend's checks and kernels live with its code (backend_impl.h).

#include <cmath>

#include "cuda/math.h"
#include "dispatch/backend_impl.h"
#include "dispatch/lowering.h"
#include "sdpa/flex.h"
#include "sdpa/cuda.h"

namespace sdpa::detail {
namespace {

const BackendImpl* const kBackends[] = {&kMathBackend, &kFlashBackend, &kEfficientBackend,
                                        &kCudnnBackend, &kOverrideableBackend};

// The kernel of `impl` for the call's device: host kernels for CPU tensors, CUDA kernels
// for CUDA tensors; other devices reach built-in kernels only through the CPU fallback.
template <typename Fn>
Fn kernel_for(const AttentionParams& params, const BackendImpl& impl, Fn host, Fn cuda,
              const char* what) {
  const Fn fn = params.device.type == DeviceType::kCPU    ? host
                : params.device.type == DeviceType::kCUDA ? cuda
                                                          : nullptr;
  SDPA_CHECK(fn != nullptr, backend_name(impl.id), " has no ", what, " kernel for tensors on ",
             device_name(params.device), " in this build");
  return fn;
}

Tensor allocate(const AttentionParams& p, const Shape& shape, DType dtype) {
  if (p.device.type == DeviceType::kCUDA) return cuda::empty(shape, dtype, p.device.index, p.stream);
  return Tensor::empty(shape, dtype);
}

void fill_zeros(const AttentionParams& p, Tensor& t) {
  if (p.device.type == DeviceType::kCUDA) {
    cuda::fill_zeros(t, p.stream);
  } else {
    t.copy_(Tensor::zeros({1}, t.dtype()).expand(t.sizes()));
  }
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
  const ForwardFn forward =
      kernel_for(params, impl, impl.forward, impl.cuda_forward, "forward");
  // No query row: out and lse have no element, and a kernel would still size its scratch
  // and loops by the keys (MATH took seconds and gigabytes for B = 0 beside 2^27 keys).
  if (params.batch * params.num_heads_q * params.q_len == 0) return;
  // No key: every row is fully masked (out = 0, lse = -inf). Filled here in O(output):
  // the kernels would still load every query row (11 s for 2^24 rows of 256).
  if (params.kv_len == 0 && params.device.type == DeviceType::kCPU) {
    Tensor zeroed = out;
    fill_zeros(params, zeroed);
    Tensor lse_rows = lse;
    lse_rows.copy_(Tensor::full({1}, -INFINITY, lse.dtype()).expand(lse.sizes()));
    return;
  }
  // dropout_p = 1 drops every weight (PyTorch: out = 0); lse is of the undropped scores,
  // so the kernel runs without dropout (its 1 / (1 - p) scaling would be infinite).
  if (params.dropout.p >= 1.0) {
    AttentionParams undropped = params;
    undropped.dropout.p = 0.0;
    forward_into(impl, undropped, out, lse);
    Tensor zeroed = out;
    fill_zeros(params, zeroed);
    return;
  }
  // Two calls, not a conditional expression: that would copy `params` (its tensors'
  // shapes included) on every call.
  if (impl.native_bias) {
    forward(params, out, lse);
  } else {
    forward(with_materialized_bias(params), out, lse);
  }
}

void backward_into(const BackendImpl& impl, const AttentionParams& params,
                   BackwardOutputs& outputs) {
  const BackwardFn backward =
      kernel_for(params, impl, impl.backward, impl.cuda_backward, "backward");
  // No query row (and no score_mod, whose captured tensors' gradients the kernels size):
  // every gradient is zero or empty.
  // dropout_p = 1: the output is 0 whatever the inputs, so every gradient is 0.
  const bool all_dropped = params.dropout.p >= 1.0;
  if ((params.batch * params.num_heads_q * params.q_len == 0 && !params.mask.score_mod) ||
      all_dropped) {
    for (Tensor* t : {&outputs.grad_q, &outputs.grad_k, &outputs.grad_v, &outputs.grad_mask}) {
      if (t->defined()) fill_zeros(params, *t);
    }
    if (all_dropped && params.mask.score_mod) {
      for (const flex::Captured& c : params.mask.score_mod->captured()) {
        outputs.grad_captured.push_back(
            c.requires_grad() ? Tensor::zeros(c.tensor().sizes(), c.tensor().dtype()) : Tensor());
      }
    }
    return;
  }
  if (impl.native_bias) {
    backward(params, outputs);
  } else {
    backward(with_materialized_bias(params), outputs);
  }
}

ForwardOutputs allocate_forward_outputs(const AttentionParams& p) {
  return {allocate(p, {p.batch, p.num_heads_q, p.q_len, p.head_dim_vo}, p.dtype),
          allocate(p, {p.batch, p.num_heads_q, p.q_len}, DType::kFloat32)};
}

BackwardOutputs allocate_backward_outputs(const AttentionParams& p) {
  BackwardOutputs outputs;
  outputs.grad_q = allocate(p, p.q.sizes(), p.dtype);
  outputs.grad_k = allocate(p, p.k.sizes(), p.dtype);
  outputs.grad_v = allocate(p, p.v.sizes(), p.dtype);
  if (p.attn_mask_requires_grad) {
    outputs.grad_mask = allocate(p, {p.batch, p.num_heads_q, p.q_len, p.kv_len}, p.dtype);
  }
  return outputs;
}

}  // namespace sdpa::detail
