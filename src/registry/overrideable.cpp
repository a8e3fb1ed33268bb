// OVERRIDEABLE: the backend of tensors on an external device. Its checks ask the
// registry whether a backend is registered for the device and whether that backend's own
// checks pass; its calls run through the registry (the plugin's kernel, a variant derived
// from it, or the CPU fallback), which allocates the outputs on the device.

#include "dispatch/backend_impl.h"
#include "registry/table.h"

namespace sdpa::registry {
namespace {

bool check_external_device(const AttentionParams& p, Reasons& r) {
  if (p.device.type == DeviceType::kExternal) return true;
  r.add("tensors are on ", device_name(p.device),
        "; OVERRIDEABLE serves tensors on an external device");
  return false;
}

bool check_backend_registered(const AttentionParams& p, Reasons& reasons) {
  if (p.device.type == DeviceType::kExternal) {
    ensure_env_backends();
    Registry& r = raw();
    std::shared_lock lock(r.mu);
    if (r.key_for(p.device) >= 0) return true;
  }
  reasons.add("no external backend is registered for ", device_name(p.device));
  return false;
}

bool check_backend_checks(const AttentionParams& p, Reasons& reasons) {
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
    for (const std::string& reason : local.items) reasons.add(name, ": ", reason);
  }
  return ok;
}

constexpr detail::NamedCheck kChecks[] = {{"external_device", check_external_device},
                                          {"backend_registered", check_backend_registered},
                                          {"backend_checks", check_backend_checks}};

// Runs attention-family op `op` for `params` on the external device's key; `ran` gets the
// backend that computed it (a CPU backend when the registry fell back to CPU).
OpCall call_on_device(OpId op, const AttentionParams& params, SDPBackend& ran) {
  OpCall call;
  call.params = &params;
  call.backend = SDPBackend::OVERRIDEABLE;
  registry::call(op, call);
  ran = call.backend;
  return call;
}

detail::ForwardOutputs external_forward(const AttentionParams& params, SDPBackend& ran) {
  OpCall call = call_on_device(OpId::kAttention, params, ran);
  return {std::move(call.returns.at(0)), std::move(call.returns.at(1))};
}

detail::BackwardOutputs external_backward(const AttentionParams& params, SDPBackend& ran) {
  OpCall call = call_on_device(OpId::kAttentionBackward, params, ran);
  detail::BackwardOutputs outputs;
  outputs.grad_q = std::move(call.returns.at(0));
  outputs.grad_k = std::move(call.returns.at(1));
  outputs.grad_v = std::move(call.returns.at(2));
  outputs.grad_mask = std::move(call.returns.at(3));
  outputs.grad_captured = std::move(call.tensor_list);
  return outputs;
}

}  // namespace
}  // namespace sdpa::registry

namespace sdpa::detail {

const BackendImpl kOverrideableBackend{SDPBackend::OVERRIDEABLE,
                                       registry::kChecks,
                                       nullptr,
                                       nullptr,
                                       false,
                                       &registry::external_forward,
                                       &registry::external_backward};

}  // namespace sdpa::detail
