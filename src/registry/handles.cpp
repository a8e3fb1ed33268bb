// The public registry API: backend handles (kernels and checks per dispatch key), device
// registration, and the op listing.

#include <sstream>

#include "registry/table.h"

namespace sdpa::registry {

std::shared_ptr<const DeviceInterface> device_interface(Device device) {
  if (device.type != DeviceType::kExternal) return nullptr;
  ensure_env_backends();
  Registry& r = raw();
  std::shared_lock lock(r.mu);
  const int key = r.key_for(device);
  return key < 0 ? nullptr : r.keys[key].iface;
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

}  // namespace sdpa
