// The registry: dispatch keys, kernels per (op, key), and the dispatcher that derives
// out=/in-place variants and falls back to CPU.
//
// Resolution for (op, key), first match wins:
//   1. an explicit kernel for (op, key);
//   2. a functional op whose .out has an explicit kernel: allocate the outs, run .out;
//   3. an .out / in-place op whose functional has a kernel (1 or 2): run it, copy the
//      results into the outs / the mutated argument;
//   4. an external key: the CPU fallback (copy to host, run the CPU op, copy back);
//   5. nothing: an error.

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <sstream>

#include "registry/registry_impl.h"

namespace sdpa::registry {
namespace {

constexpr int kCpuKey = 0;
constexpr int kCudaKey = 1;

struct KeyEntry {
  std::string name;
  Device device;
  std::shared_ptr<const DeviceInterface> iface;  // external devices only
  std::vector<std::pair<std::string, BackendCheck>> checks;
  std::array<std::shared_ptr<const BoxedKernel>, kNumOps> kernels{};
};

struct OpEntry {
  FunctionSchema schema;
  std::string name;        // full name, "attention.out"
  int functional = -1;     // the functional op of this family
  int out_variant = -1;    // the family's .out op (set on the functional)
  int tensor_returns = 0;  // Tensor returns (not Tensor[])
  // OpCall::args layout: the Tensor arguments not folded into params, in schema order.
  std::vector<std::string> arg_names;
  std::vector<int> write_args;  // indices into args of the `(x!)` outs
  std::string mutated_param;    // in-place ops: the folded argument they write ("query")
};

class Registry {
 public:
  Registry() {
    for (int i = 0; i < kNumOps; ++i) {
      const OpDecl& decl = op_decl(static_cast<OpId>(i));
      OpEntry e;
      e.schema = parse_schema(decl.schema);
      e.name = e.schema.full_name();
      for (const SchemaArgument& a : e.schema.arguments) {
        if (!a.is_tensor()) continue;
        if (decl.takes_params && !a.kwarg_only) {
          if (a.is_write) e.mutated_param = a.name;
          continue;
        }
        if (a.is_write) e.write_args.push_back(static_cast<int>(e.arg_names.size()));
        e.arg_names.push_back(a.name);
      }
      for (const SchemaArgument& r : e.schema.returns) e.tensor_returns += r.is_tensor();
      ops.push_back(std::move(e));
    }
    for (OpEntry& e : ops) {
      e.functional = find(e.schema.functional_name());
      SDPA_CHECK(e.functional >= 0, "registry: ", e.name, " has no functional op");
      if (e.schema.is_out()) {
        ops[e.functional].out_variant = static_cast<int>(&e - ops.data());
        SDPA_CHECK(static_cast<int>(e.write_args.size()) == e.tensor_returns,
                   "registry: ", e.name, " must return exactly its outs");
      }
    }
    keys.push_back(KeyEntry{"CPU", Device{DeviceType::kCPU, 0}, nullptr, {}, {}});
    keys.push_back(KeyEntry{"CUDA", Device{DeviceType::kCUDA, 0}, nullptr, {}, {}});
  }

  int find(std::string_view name) const {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].name == name) return static_cast<int>(i);
    }
    return -1;
  }

  // Requires mu held (shared or unique).
  int key_for(Device d) const {
    switch (d.type) {
      case DeviceType::kCPU: return kCpuKey;
      case DeviceType::kCUDA: return kCudaKey;
      case DeviceType::kExternal: {
        for (size_t i = 2; i < keys.size(); ++i) {
          if (keys[i].device == d) return static_cast<int>(i);
        }
        return -1;
      }
    }
    return -1;
  }

  mutable std::shared_mutex mu;
  std::vector<OpEntry> ops;  // immutable after construction
  std::vector<KeyEntry> keys;
  std::array<std::atomic<int64_t>, kNumOps> fallbacks{};
  std::array<std::atomic<bool>, kNumOps> warned{};
};

// The registry with its ops and built-in keys; CPU kernels not yet installed.
Registry& raw() {
  static Registry r;
  return r;
}

void set_kernel(Registry& r, int key, int op, BoxedKernel kernel) {
  std::unique_lock lock(r.mu);
  SDPA_CHECK(key >= 0 && key < static_cast<int>(r.keys.size()), "registry: unknown dispatch key ",
             key);
  r.keys[key].kernels[op] = std::make_shared<const BoxedKernel>(std::move(kernel));
}

// True on the thread installing the built-in kernels (their registration calls reg()).
thread_local bool t_installing_builtins = false;

// The registry with the CPU kernels installed.
Registry& reg() {
  static std::once_flag once;
  if (!t_installing_builtins) {
    std::call_once(once, [] {
      t_installing_builtins = true;
      try {
        register_cpu_kernels(BackendHandle(kCpuKey));
      } catch (...) {
        t_installing_builtins = false;
        throw;
      }
      t_installing_builtins = false;
    });
  }
  return raw();
}

enum class Route { kKernel, kDerivedFromOut, kDerivedFromFunctional, kFallback, kNone };

struct Resolved {
  Route route = Route::kNone;
  std::shared_ptr<const BoxedKernel> kernel;  // kKernel
  int from = -1;                              // kDerived*: the op it comes from
};

// Requires r.mu held.
Resolved resolve(const Registry& r, int op, int key) {
  if (key < 0) return {};
  const OpEntry& e = r.ops[op];
  const KeyEntry& k = r.keys[key];
  if (k.kernels[op]) return {Route::kKernel, k.kernels[op], op};
  if (e.schema.is_functional()) {
    if (e.out_variant >= 0 && k.kernels[e.out_variant]) {
      return {Route::kDerivedFromOut, nullptr, e.out_variant};
    }
  } else {
    const Resolved f = resolve(r, e.functional, key);
    if (f.route == Route::kKernel || f.route == Route::kDerivedFromOut) {
      return {Route::kDerivedFromFunctional, nullptr, e.functional};
    }
  }
  if (key != kCpuKey && k.iface) {
    const Resolved cpu = resolve(r, op, kCpuKey);
    if (cpu.route != Route::kNone) return {Route::kFallback, nullptr, -1};
  }
  return {};
}

std::string key_label(const Registry& r, int key, Device device) {
  if (key < 0) return device_name(device);
  std::shared_lock lock(r.mu);
  const KeyEntry& k = r.keys[key];
  if (k.device.type == DeviceType::kExternal) return k.name + " (" + device_name(k.device) + ")";
  return k.name;
}

Device call_device(const OpCall& call) {
  if (call.params) return call.params->device;
  for (const Tensor& t : call.args) {
    if (t.defined()) return t.device();
  }
  return Device{};
}

bool strict_backends() {
  const char* s = std::getenv("SDPA_STRICT_BACKENDS");
  return s != nullptr && *s != '\0' && std::strcmp(s, "0") != 0;
}

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

void execute(Registry& r, int op, int key, OpCall& call, const std::vector<TensorMeta>& metas);

void fallback(Registry& r, int op, int key, OpCall& call, Device device) {
  const OpEntry& e = r.ops[op];
  const std::string where = key_label(r, key, device);
  SDPA_CHECK(!strict_backends(), e.name, ": ", where, " has no kernel for it and "
             "SDPA_STRICT_BACKENDS=1 forbids the CPU fallback (unset it to run the op on CPU, "
             "with its tensors copied to host and back)");
  r.fallbacks[op].fetch_add(1);
  if (!r.warned[op].exchange(true)) {
    std::fprintf(stderr,
                 "sdpa: warning: %s has no kernel for %s; running it on CPU (tensors copied to "
                 "host and back). SDPA_STRICT_BACKENDS=1 makes this an error. (Shown once per "
                 "op.)\n",
                 where.c_str(), e.name.c_str());
  }

  AttentionParams host_params;
  OpCall host;
  if (call.params) {
    host_params = params_to_host(*call.params);
    host.params = &host_params;
  }
  host.args.resize(call.args.size());
  for (size_t i = 0; i < call.args.size(); ++i) {
    const Tensor& t = call.args[i];
    bool is_write = false;
    for (int w : e.write_args) is_write |= w == static_cast<int>(i);
    // Outs are write-only: fresh host tensors of their shape; inputs are copied.
    host.args[i] = is_write ? (t.defined() ? Tensor::empty(t.sizes(), t.dtype()) : Tensor())
                            : to_host(t);
  }
  const std::vector<TensorMeta> host_metas =
      op_decl(static_cast<OpId>(op)).meta(host);
  execute(r, op, kCpuKey, host, host_metas);
  call.backend = host.backend;

  if (e.schema.is_out()) {
    for (int w : e.write_args) copy(call.args[w], host.args[w]);
    call.returns.clear();
    for (int w : e.write_args) call.returns.push_back(call.args[w]);
  } else if (e.schema.is_inplace()) {
    copy(call.params->q, host_params.q);
    call.returns = {call.params->q};
  } else {
    call.returns.clear();
    for (const Tensor& t : host.returns) call.returns.push_back(to_device(t, device));
    call.tensor_list.clear();
    for (const Tensor& t : host.tensor_list) call.tensor_list.push_back(to_device(t, device));
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

}  // namespace

int find_op(std::string_view name) { return raw().find(name); }

void call(OpId id, OpCall& c) { dispatch(static_cast<int>(id), c); }

std::shared_ptr<const DeviceInterface> device_interface(Device device) {
  if (device.type != DeviceType::kExternal) return nullptr;
  ensure_env_backends();
  Registry& r = raw();
  std::shared_lock lock(r.mu);
  const int key = r.key_for(device);
  return key < 0 ? nullptr : r.keys[key].iface;
}

bool check_external_backend_registered(const AttentionParams& p, Reasons& reasons) {
  if (p.device.type == DeviceType::kExternal) {
    ensure_env_backends();
    Registry& r = raw();
    std::shared_lock lock(r.mu);
    if (r.key_for(p.device) >= 0) return true;
  }
  reasons.add("no external backend is registered for " + device_name(p.device));
  return false;
}

bool check_external_backend_checks(const AttentionParams& p, Reasons& reasons) {
  if (p.device.type != DeviceType::kExternal) return false;  // reported by the checks above
  Registry& r = reg();
  std::string name;
  std::vector<std::pair<std::string, BackendCheck>> checks;
  {
    std::shared_lock lock(r.mu);
    const int key = r.key_for(p.device);
    if (key < 0) return false;
    const int op = static_cast<int>(p.backward ? OpId::kAttentionBackward : OpId::kAttention);
    const Route route = resolve(r, op, key).route;
    // Without a kernel of its own the CPU fallback runs the call: the backend's checks,
    // which describe its kernels, do not apply.
    if (route == Route::kFallback || route == Route::kNone) return true;
    name = r.keys[key].name;
    checks = r.keys[key].checks;
  }
  bool ok = true;
  for (const auto& [check_name, check] : checks) {
    Reasons local{reasons.collect, {}};
    if (check(p, local)) continue;
    ok = false;
    if (!reasons.collect) return false;
    if (local.items.empty()) local.items.push_back("check '" + check_name + "' failed");
    for (const std::string& reason : local.items) reasons.add(name + ": " + reason);
  }
  return ok;
}

}  // namespace sdpa::registry

namespace sdpa {

using registry::raw;
using registry::reg;

std::string BackendHandle::name() const {
  auto& r = raw();
  std::shared_lock lock(r.mu);
  SDPA_CHECK(key_ >= 0 && key_ < static_cast<int>(r.keys.size()), "BackendHandle: invalid key");
  return r.keys[key_].name;
}

Device BackendHandle::device() const {
  auto& r = raw();
  std::shared_lock lock(r.mu);
  SDPA_CHECK(key_ >= 0 && key_ < static_cast<int>(r.keys.size()), "BackendHandle: invalid key");
  return r.keys[key_].device;
}

BackendHandle& BackendHandle::impl_boxed(std::string_view op, BoxedKernel kernel) {
  auto& r = reg();
  const int id = r.find(op);
  if (id < 0) {
    std::string known;
    for (const auto& e : r.ops) known += (known.empty() ? "" : ", ") + e.name;
    detail::throw_error("impl: unknown op '", op, "' (known: ", known, ")");
  }
  SDPA_CHECK(kernel != nullptr, "impl: ", op, ": expected a kernel, got an empty function");
  registry::set_kernel(r, key_, id, std::move(kernel));
  return *this;
}

bool BackendHandle::remove(std::string_view op) {
  auto& r = reg();
  const int id = r.find(op);
  SDPA_CHECK(id >= 0, "remove: unknown op '", op, "'");
  std::unique_lock lock(r.mu);
  SDPA_CHECK(key_ >= 0 && key_ < static_cast<int>(r.keys.size()), "BackendHandle: invalid key");
  const bool had = r.keys[key_].kernels[id] != nullptr;
  r.keys[key_].kernels[id].reset();
  return had;
}

BackendHandle& BackendHandle::add_check(std::string check_name, BackendCheck check) {
  auto& r = raw();
  SDPA_CHECK(check != nullptr, "add_check: ", check_name, ": expected a function");
  std::unique_lock lock(r.mu);
  SDPA_CHECK(key_ >= 0 && key_ < static_cast<int>(r.keys.size()), "BackendHandle: invalid key");
  r.keys[key_].checks.emplace_back(std::move(check_name), std::move(check));
  return *this;
}

BackendHandle register_device(DeviceInterface device) {
  SDPA_CHECK(!device.name.empty(), "register_device: expected a name, got an empty one");
  SDPA_CHECK(device.allocate && device.free && device.copy_to_host && device.copy_from_host,
             "register_device: ", device.name, ": allocate, free, copy_to_host and "
             "copy_from_host are required");
  auto& r = reg();
  std::unique_lock lock(r.mu);
  int32_t index = 0;
  for (const auto& k : r.keys) {
    SDPA_CHECK(k.name != device.name, "register_device: a dispatch key named '", device.name,
               "' is already registered");
    if (k.device.type == DeviceType::kExternal) index = std::max(index, k.device.index + 1);
  }
  registry::KeyEntry entry;
  entry.name = device.name;
  entry.device = Device{DeviceType::kExternal, index};
  entry.iface = std::make_shared<const DeviceInterface>(std::move(device));
  r.keys.push_back(std::move(entry));
  return BackendHandle(static_cast<int>(r.keys.size()) - 1);
}

BackendHandle backend_for(Device device) {
  registry::ensure_env_backends();
  auto& r = reg();
  std::shared_lock lock(r.mu);
  const int key = r.key_for(device);
  SDPA_CHECK(key >= 0, "backend_for: no dispatch key serves ", device_name(device));
  return BackendHandle(key);
}

BackendHandle backend_named(std::string_view name) {
  registry::ensure_env_backends();
  auto& r = reg();
  std::shared_lock lock(r.mu);
  for (size_t i = 0; i < r.keys.size(); ++i) {
    if (r.keys[i].name == name) return BackendHandle(static_cast<int>(i));
  }
  detail::throw_error("backend_named: no dispatch key is named '", name, "'");
}

std::vector<std::string> dispatch_keys() {
  registry::ensure_env_backends();
  auto& r = reg();
  std::shared_lock lock(r.mu);
  std::vector<std::string> names;
  for (const auto& k : r.keys) names.push_back(k.name);
  return names;
}

std::vector<OpInfo> ops() {
  registry::ensure_env_backends();
  auto& r = reg();
  std::shared_lock lock(r.mu);
  std::vector<OpInfo> out;
  for (size_t op = 0; op < r.ops.size(); ++op) {
    OpInfo info{r.ops[op].name, r.ops[op].schema.to_string(), {}};
    for (size_t key = 0; key < r.keys.size(); ++key) {
      const registry::Resolved res = registry::resolve(r, static_cast<int>(op),
                                                       static_cast<int>(key));
      OpImplementation impl{r.keys[key].name, KernelSource::kNone, ""};
      switch (res.route) {
        case registry::Route::kKernel: impl.source = KernelSource::kKernel; break;
        case registry::Route::kDerivedFromOut:
        case registry::Route::kDerivedFromFunctional:
          impl.source = KernelSource::kDerived;
          impl.from = r.ops[res.from].name;
          break;
        case registry::Route::kFallback: impl.source = KernelSource::kFallback; break;
        case registry::Route::kNone: break;
      }
      info.implementations.push_back(std::move(impl));
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::string describe_ops() {
  std::ostringstream os;
  for (const OpInfo& info : ops()) {
    os << info.schema << '\n';
    for (const OpImplementation& impl : info.implementations) {
      os << "  " << impl.dispatch_key << ": ";
      switch (impl.source) {
        case KernelSource::kKernel: os << "kernel"; break;
        case KernelSource::kDerived: os << "derived from " << impl.from; break;
        case KernelSource::kFallback: os << "CPU fallback"; break;
        case KernelSource::kNone: os << "-"; break;
      }
      os << '\n';
    }
  }
  return os.str();
}

void call_op(std::string_view name, OpCall& call) {
  const int id = raw().find(name);
  SDPA_CHECK(id >= 0, "call_op: unknown op '", name, "'");
  registry::dispatch(id, call);
}

std::map<std::string, int64_t> fallback_counts() {
  auto& r = raw();
  std::map<std::string, int64_t> counts;
  for (size_t op = 0; op < r.ops.size(); ++op) {
    if (const int64_t n = r.fallbacks[op].load()) counts[r.ops[op].name] = n;
  }
  return counts;
}

void reset_fallback_counts() {
  auto& r = raw();
  for (auto& n : r.fallbacks) n = 0;
  for (auto& w : r.warned) w = false;
}

}  // namespace sdpa
