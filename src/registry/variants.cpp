// The dispatcher: validates a call against its op's meta, checks out= and in-place
// targets, and runs explicit kernels or the variants derived from them (resolution:
// table.cpp).

#include "registry/table.h"

namespace sdpa::registry {
namespace {

// The tensors a call reads, named as in the schema (for overlap checks).
std::vector<std::pair<std::string, Tensor>> call_inputs(const OpEntry& e, const OpCall& call) {
  std::vector<std::pair<std::string, Tensor>> in;
  if (const AttentionParams* p = call.params) {
    in = {{"query", p->q}, {"key", p->k}, {"value", p->v}};
    if (p->mask.dense.defined()) in.emplace_back("attn_mask", p->mask.dense);
    if (p->backward) {
      in.emplace_back("grad_out", p->grad_out);
      in.emplace_back("out", p->out);
      in.emplace_back("lse", p->lse);
    }
  }
  for (size_t i = 0; i < call.args.size() && i < e.arg_names.size(); ++i) {
    bool is_write = false;
    for (int w : e.write_args) is_write |= w == static_cast<int>(i);
    if (!is_write) in.emplace_back(e.arg_names[i], call.args[i]);
  }
  return in;
}

// Shape of an output as the caller sees it (3-D / 2-D for unbatched attention calls).
Shape user_shape(const OpCall& call, Shape shape) {
  if (call.params && call.params->unbatched && !shape.empty()) shape.erase(shape.begin());
  return shape;
}

// The 4-D view a kernel writes for a caller's out tensor.
Tensor kernel_view(const OpCall& call, const Tensor& t) {
  return call.params && call.params->unbatched ? t.unsqueeze(0) : t;
}

// Checks the outs of an out= call, replacing undefined / zero-element outs by new tensors.
void prepare_outs(const OpEntry& e, const std::vector<TensorMeta>& metas, OpCall& call,
                  Device device) {
  SDPA_CHECK(call.args.size() == e.arg_names.size(), e.name, ": expected ",
             e.arg_names.size(), " tensor arguments (", e.arg_names.size(), " outs), got ",
             call.args.size());
  for (size_t j = 0; j < e.write_args.size(); ++j) {
    const std::string& name = e.arg_names[e.write_args[j]];
    Tensor& out = call.args[e.write_args[j]];
    const TensorMeta& m = metas[j];
    const Shape want = user_shape(call, m.shape);
    const bool resize = !out.defined() || (out.numel() == 0 && checked_numel(want) != 0);
    if (out.defined()) {
      SDPA_CHECK(out.dtype() == m.dtype, e.name, ": ", name, ": expected dtype ",
                 dtype_name(m.dtype), ", got ", dtype_name(out.dtype()));
      SDPA_CHECK(out.device() == device, e.name, ": ", name, ": expected device ",
                 device_name(device), " (the inputs' device), got ", device_name(out.device()));
    }
    if (resize) {
      out = empty(want, m.dtype, device);
      continue;
    }
    SDPA_CHECK(out.sizes() == want, e.name, ": ", name, ": expected shape ", shape_str(want),
               ", got ", shape_str(out.sizes()));
  }
  const auto inputs = call_inputs(e, call);
  for (size_t j = 0; j < e.write_args.size(); ++j) {
    const std::string& name = e.arg_names[e.write_args[j]];
    const Tensor& out = call.args[e.write_args[j]];
    for (const auto& [in_name, in] : inputs) {
      SDPA_CHECK(!overlaps(out, in), e.name, ": ", name, " overlaps ", in_name,
                 " (they share memory); an out= tensor must not alias an input");
    }
    for (size_t i = 0; i < j; ++i) {
      const std::string& other = e.arg_names[e.write_args[i]];
      SDPA_CHECK(!overlaps(out, call.args[e.write_args[i]]), e.name, ": ", name, " overlaps ",
                 other, " (they share memory); out= tensors must not alias each other");
    }
  }
}

void check_inplace(const OpEntry& e, const std::vector<TensorMeta>& metas, const OpCall& call) {
  const Tensor& self = call.params->q;
  SDPA_CHECK(self.sizes() == metas[0].shape && self.dtype() == metas[0].dtype, e.name, ": ",
             e.mutated_param, ": the result ", shape_str(user_shape(call, metas[0].shape)), " ",
             dtype_name(metas[0].dtype), " is written into ", e.mutated_param, ", which is ",
             shape_str(user_shape(call, self.sizes())), " ", dtype_name(self.dtype()),
             "; in-place attention needs head_dim_vo == head_dim_qk (Ev == E)");
}

// Checks what an explicit functional kernel returned against the op's meta.
void check_returns(const Registry& r, const OpEntry& e, int key,
                   const std::vector<TensorMeta>& metas, OpCall& call, Device device) {
  if (static_cast<int>(call.returns.size()) < e.tensor_returns) {
    call.returns.resize(e.tensor_returns);
  }
  for (size_t i = 0; i < metas.size() && i < call.returns.size(); ++i) {
    const Tensor& t = call.returns[i];
    const TensorMeta& m = metas[i];
    if (!m.defined) continue;
    SDPA_CHECK(t.defined() && t.sizes() == m.shape && t.dtype() == m.dtype &&
                   t.device() == device,
               key_label(r, key, device), "'s ", e.name, " kernel returned ",
               e.schema.returns[i].name, " ", t.describe(), "; expected ", shape_str(m.shape),
               " ", dtype_name(m.dtype), " ", device_name(device));
  }
}

// Runs an explicit kernel, giving out= kernels contiguous outs (a temporary when the
// caller's out has other strides).
void run_explicit(Registry& r, int op, int key, const BoxedKernel& kernel, OpCall& call,
                  const std::vector<TensorMeta>& metas, Device device) {
  const OpEntry& e = r.ops[op];
  if (e.schema.is_out()) {
    OpCall k;
    k.params = call.params;
    k.backend = call.backend;
    k.args.resize(call.args.size());
    std::vector<std::pair<Tensor, Tensor>> copy_back;  // (caller view, temporary)
    for (size_t i = 0; i < call.args.size(); ++i) k.args[i] = kernel_view(call, call.args[i]);
    for (size_t j = 0; j < e.write_args.size(); ++j) {
      Tensor& out = k.args[e.write_args[j]];
      if (!out.is_contiguous()) {
        Tensor tmp = empty(metas[j].shape, metas[j].dtype, device);
        copy_back.emplace_back(out, tmp);
        out = tmp;
      }
    }
    kernel(k);
    for (const auto& [view, tmp] : copy_back) copy(view, tmp);
    call.backend = k.backend;
    call.returns.clear();
    for (int w : e.write_args) call.returns.push_back(call.args[w]);
  } else if (e.schema.is_inplace()) {
    kernel(call);
    call.returns = {call.params->q};
  } else {
    call.returns.clear();
    call.tensor_list.clear();
    kernel(call);
    check_returns(r, e, key, metas, call, device);
  }
}

}  // namespace

void execute(Registry& r, int op, int key, OpCall& call, const std::vector<TensorMeta>& metas) {
  const OpEntry& e = r.ops[op];
  const Device device = call_device(call);
  Resolved res;
  {
    std::shared_lock lock(r.mu);
    res = resolve(r, op, key);
  }
  switch (res.route) {
    case Route::kKernel:
      run_explicit(r, op, key, *res.kernel, call, metas, device);
      return;
    case Route::kDerivedFromOut: {
      // Functional from .out: allocate the outs the meta describes, run .out.
      const OpEntry& out_op = r.ops[res.from];
      for (size_t j = out_op.write_args.size(); j < metas.size(); ++j) {
        SDPA_CHECK(!metas[j].defined, e.name, ": ", key_label(r, key, device), " has only ",
                   out_op.name, ", which does not produce ", e.schema.returns[j].name,
                   "; register a functional ", e.name, " kernel");
      }
      OpCall o;
      o.params = call.params;
      o.backend = call.backend;
      o.args = call.args;
      for (size_t j = 0; j < out_op.write_args.size(); ++j) {
        o.args.push_back(empty(metas[j].shape, metas[j].dtype, device));
      }
      // The outs are fresh 4-D tensors: run .out's kernel directly (no checks needed).
      std::shared_ptr<const BoxedKernel> kernel;
      {
        std::shared_lock lock(r.mu);
        kernel = r.keys[key].kernels[res.from];
      }
      (*kernel)(o);
      call.backend = o.backend;
      call.returns.assign(o.args.end() - static_cast<std::ptrdiff_t>(out_op.write_args.size()),
                          o.args.end());
      call.returns.resize(e.tensor_returns);
      call.tensor_list.clear();
      return;
    }
    case Route::kDerivedFromFunctional: {
      // .out / in-place from the functional: compute, then copy into the written tensors.
      OpCall f;
      f.params = call.params;
      f.backend = call.backend;
      for (size_t i = 0; i < call.args.size(); ++i) {
        bool is_write = false;
        for (int w : e.write_args) is_write |= w == static_cast<int>(i);
        if (!is_write) f.args.push_back(call.args[i]);
      }
      execute(r, res.from, key, f, metas);
      call.backend = f.backend;
      call.returns.clear();
      if (e.schema.is_out()) {
        for (size_t j = 0; j < e.write_args.size(); ++j) {
          copy(kernel_view(call, call.args[e.write_args[j]]), f.returns.at(j));
          call.returns.push_back(call.args[e.write_args[j]]);
        }
      } else {
        copy(call.params->q, f.returns.at(0));
        call.returns.push_back(call.params->q);
      }
      return;
    }
    case Route::kFallback:
      fallback(r, op, key, call, device);
      return;
    case Route::kNone:
      break;
  }
  detail::throw_error(e.name, ": no kernel for ", key_label(r, key, device),
                      key < 0 ? " (no backend is registered for this device)" : "");
}

void dispatch(int op, OpCall& call) {
  ensure_env_backends();
  Registry& r = reg();
  const OpEntry& e = r.ops[op];
  const OpDecl& decl = op_decl(static_cast<OpId>(op));
  SDPA_CHECK(!decl.takes_params || call.params != nullptr, e.name,
             ": expected the call's AttentionParams (OpCall::params), got none");
  const Device device = call_device(call);
  const std::vector<TensorMeta> metas = decl.meta(call);
  if (e.schema.is_out()) prepare_outs(e, metas, call, device);
  if (e.schema.is_inplace()) check_inplace(e, metas, call);
  int key;
  {
    std::shared_lock lock(r.mu);
    key = r.key_for(device);
  }
  execute(r, op, key, call, metas);
}

int find_op(std::string_view name) { return raw().find(name); }

void call(OpId id, OpCall& c) { dispatch(static_cast<int>(id), c); }

}  // namespace sdpa::registry
