// The registry's tables: construction from the op declarations, the built-in kernels'
// one-time installation, and (op, key) resolution.
//
// Resolution for (op, key), first match wins:
//   1. an explicit kernel for (op, key);
//   2. a functional op whose .out has an explicit kernel: allocate the outs, run .out;
//   3. an .out / in-place op whose functional has a kernel (1 or 2): run it, copy the
//      results into the outs / the mutated argument;
//   4. an external key: the CPU fallback (copy to host, run the CPU op, copy back);
//   5. nothing: an error.

#include "registry/table.h"

namespace sdpa::registry {
namespace {

// True on the thread installing the built-in kernels (their registration calls reg()).
thread_local bool t_installing_builtins = false;

}  // namespace

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

}  // namespace sdpa::registry
