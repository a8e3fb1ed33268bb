// The CPU dispatch key's kernels, serving the public op API (out= and in-place variants,
// call_op) and the CPU fallback of external backends. attention.out and
// attention_backward[.out] run the backend selection chose (MATH / FLASH_ATTENTION,
// through the backend table); the functional attention and both in-place variants are
// derived by the registry. The plain forward and backward calls do not come here: they
// run the selected backend's kernel directly (src/dispatch/attention.cpp).

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "core/threading.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"
#include "dispatch/backend_impl.h"
#include "dispatch/backend_state.h"
#include "registry/registry_impl.h"

namespace sdpa::registry {
namespace {

const detail::BackendImpl& cpu_impl(OpCall& call) {
  call.backend = cpu_backend_for(*call.params, call.backend);
  return detail::backend_impl(call.backend);
}

// attention.out: writes out [B, Hq, L, Ev] and lse [B, Hq, L] (contiguous).
void attention_out(OpCall& call) {
  const AttentionParams& p = *call.params;
  detail::forward_into(cpu_impl(call), p, call.args.at(0), call.args.at(1));
}

// attention_backward: returns grad_q/k/v, the full [B, Hq, L, S] mask gradient when asked
// for, and the flex captured tensors' gradients as the Tensor[] return.
void attention_backward(OpCall& call) {
  const AttentionParams& p = *call.params;
  const detail::BackendImpl& impl = cpu_impl(call);
  detail::BackwardOutputs outputs = detail::allocate_backward_outputs(p);
  detail::backward_into(impl, p, outputs);
  call.returns = {outputs.grad_q, outputs.grad_k, outputs.grad_v, outputs.grad_mask};
  call.tensor_list = std::move(outputs.grad_captured);
}

// attention_backward.out: writes grad_q/k/v (contiguous; no mask gradient).
void attention_backward_out(OpCall& call) {
  const AttentionParams& p = *call.params;
  detail::BackwardOutputs outputs;
  outputs.grad_q = call.args.at(0);
  outputs.grad_k = call.args.at(1);
  outputs.grad_v = call.args.at(2);
  detail::backward_into(cpu_impl(call), p, outputs);
}

// Merges two partial attention results row by row in float64, rows in parallel (see
// registry.h): each side is the partial state {m = lse, l = 1, o = out} of its keys
// (cpu/online_softmax.h).
std::tuple<Tensor, Tensor> cpu_merge_attention_states(const Tensor& out_a, const Tensor& lse_a,
                                                      const Tensor& out_b, const Tensor& lse_b) {
  // Inputs in their own dtypes (a copy only where one is strided), read element by element
  // into double; every row is computed in double and rounded once to the output dtype.
  const Tensor outs[] = {out_a.contiguous(), out_b.contiguous()};
  const Tensor lses[] = {lse_a.contiguous(), lse_b.contiguous()};
  Tensor out = Tensor::empty(out_a.sizes(), out_a.dtype());
  Tensor lse = Tensor::empty(lse_a.sizes(), DType::kFloat32);
  const int64_t rows = lse_a.numel();
  const int64_t width = out_a.size(-1);
  const auto merge_rows = [&](auto element) {
    using T = decltype(element);
    const T* src[] = {outs[0].data<T>(), outs[1].data<T>()};
    const float* lse_in[] = {lses[0].data<float>(), lses[1].data<float>()};
    T* dst = out.data<T>();
    float* lse_out = lse.data<float>();
    // Memory-bound: each element of the three [rows, width] tensors moves once.
    const double bytes = 3.0 * static_cast<double>(rows * width) * sizeof(T);
    const int threads = detail::ThreadingContext::current().threads_for(rows, {0, bytes});
    detail::run_region(threads, [&] {
      std::vector<double> row(static_cast<size_t>(width));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        cpu::LsePartial<double> sides[2];
        cpu::PartialMerge<double> merge;
        for (int s = 0; s < 2; ++s) {
          sides[s] = cpu::partial_from_lse(static_cast<double>(lse_in[s][r]));
          merge.see(sides[s].m, sides[s].l);
        }
        std::fill(row.begin(), row.end(), 0.0);
        double l = 0.0;
        for (int s = 0; s < 2 && !merge.empty(); ++s) {
          if (!cpu::contributes(sides[s].l)) continue;
          const double w = merge.weight(sides[s].m);
          l += w * sides[s].l;
          const T* x = src[s] + r * width;
          for (int64_t e = 0; e < width; ++e) {
            row[static_cast<size_t>(e)] += w * static_cast<double>(cpu::widen(x[e]));
          }
        }
        const cpu::RowFinish<double> end = cpu::finalize(merge.max(), l);
        T* y = dst + r * width;
        for (int64_t e = 0; e < width; ++e) {
          y[e] = cpu::narrow<T>(end.masked ? 0.0 : row[static_cast<size_t>(e)] * end.inv_l);
        }
        lse_out[r] = static_cast<float>(end.lse);
      }
    });
  };
  switch (out_a.dtype()) {
    case DType::kFloat64: merge_rows(double{}); break;
    case DType::kBFloat16: merge_rows(bfloat16{}); break;
    case DType::kFloat16: merge_rows(float16{}); break;
    default: merge_rows(float{}); break;
  }
  return {out, lse};
}

// Returns the call's mask as an additive [B, Hq, L, S] tensor of the query dtype.
Tensor cpu_materialize_bias(const AttentionParams& p) {
  const BiasShape shape{p.batch, p.num_heads_q, p.q_len, p.kv_len};
  Tensor dense;  // broadcastable to shape.scores(): bool (keep) or additive
  if (p.bias) {
    // A tensor mask (or a bias only materialize() describes) is already lowered to its
    // [B, Hq, L, S] view, on the host also in the CPU fallback.
    const bool lowered_dense = p.bias->needs_materialization() ||
                               dynamic_cast<const TensorBias*>(p.bias.get()) != nullptr;
    dense = lowered_dense ? p.mask.dense : p.bias->materialize(shape, p.dtype);
  } else if (!p.mask.bands.empty()) {
    dense = causal_upper_left(p.q_len, p.kv_len)->materialize(shape, p.dtype);  // is_causal
  }
  Tensor bias = Tensor::zeros(shape.scores(), p.dtype);
  if (!dense.defined()) return bias;
  const Tensor full = dense.expand(shape.scores());
  if (full.dtype() != DType::kBool) {
    bias.copy_(full);
    return bias;
  }
  const Tensor keep = full.to(DType::kBool);
  const bool* k = keep.data<bool>();
  const int64_t n = bias.numel();
  Tensor minus_inf = Tensor::full({1}, -std::numeric_limits<double>::infinity(), p.dtype);
  const size_t esize = element_size(p.dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (!k[i]) {
      std::memcpy(static_cast<char*>(bias.data_ptr()) + i * esize, minus_inf.data_ptr(), esize);
    }
  }
  return bias;
}

}  // namespace

SDPBackend cpu_backend_for(const AttentionParams& params, SDPBackend chosen) {
  if (chosen == SDPBackend::MATH || chosen == SDPBackend::FLASH_ATTENTION) return chosen;
  std::vector<SDPBackend> cpu;
  // Named: a range-for over the temporary list's span() would read it after its end.
  const auto active = detail::active_backend_list();
  for (SDPBackend b : active.span()) {
    if (b == SDPBackend::MATH || b == SDPBackend::FLASH_ATTENTION) cpu.push_back(b);
  }
  if (cpu.empty()) cpu = {SDPBackend::FLASH_ATTENTION, SDPBackend::MATH};
  return detail::select_from(params, cpu);
}

void register_cpu_kernels(BackendHandle cpu) {
  cpu.impl_boxed("attention.out", attention_out)
      .impl_boxed("attention_backward", attention_backward)
      .impl_boxed("attention_backward.out", attention_backward_out)
      .impl(op::merge_attention_states, cpu_merge_attention_states)
      .impl(op::materialize_bias, cpu_materialize_bias);
}

}  // namespace sdpa::registry
