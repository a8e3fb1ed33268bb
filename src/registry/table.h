#pragma once
// The registry's tables (ops, dispatch keys, kernels per (op, key)) and the resolution of
// (op, key) to a kernel, a derived variant or the CPU fallback. Internal to src/registry.

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "registry/registry_impl.h"

namespace sdpa::registry {

inline constexpr int kCpuKey = 0;
inline constexpr int kCudaKey = 1;

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

/// The registry with its ops and built-in keys; CPU kernels not yet installed.
Registry& raw();
/// The registry with the CPU kernels installed.
Registry& reg();

/// Installs `kernel` for (op, key).
void set_kernel(Registry& r, int key, int op, BoxedKernel kernel);

enum class Route { kKernel, kDerivedFromOut, kDerivedFromFunctional, kFallback, kNone };

struct Resolved {
  Route route = Route::kNone;
  std::shared_ptr<const BoxedKernel> kernel;  // kKernel
  int from = -1;                              // kDerived*: the op it comes from
};

/// How (op, key) runs; first match wins (see registry.h). Requires r.mu held.
Resolved resolve(const Registry& r, int op, int key);

/// "CPU", "CUDA" or "NAME (device)" for error messages.
std::string key_label(const Registry& r, int key, Device device);

/// The device of a call: its params' device, else its first defined tensor argument's.
Device call_device(const OpCall& call);

/// Runs op `op` on `key` (resolution, derived variants, fallback); outs already checked.
void execute(Registry& r, int op, int key, OpCall& call, const std::vector<TensorMeta>& metas);

/// Runs op `op` for an external key that has no kernel for it on CPU: copies the inputs to
/// host, runs the CPU op, copies the results back (counted, warned once per op).
void fallback(Registry& r, int op, int key, OpCall& call, Device device);

/// Validates a call (meta, outs, in-place target) and executes it.
void dispatch(int op, OpCall& call);

}  // namespace sdpa::registry
