// Backend plugins: shared libraries loaded with dlopen, by load_backend or once from
// SDPA_BACKENDS. A plugin is never unloaded (its kernels and device functions stay
// registered for the life of the process).

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "registry/registry_impl.h"
#include "sdpa/plugin.h"

namespace sdpa {
namespace {

std::recursive_mutex g_mu;  // recursive: a plugin's registration may load another plugin
std::vector<LoadedBackend> g_loaded;
std::map<std::string, size_t> g_by_real_path;
std::atomic<bool> g_env_done{false};
thread_local bool t_env_loading = false;

using AbiVersionFn = int (*)();
using RegisterFn = void (*)(PluginRegistrar&);

LoadedBackend load(const std::string& path, const char* origin) {
  std::lock_guard lock(g_mu);
  char* real = ::realpath(path.c_str(), nullptr);
  SDPA_CHECK(real != nullptr, origin, ": cannot load '", path, "': ", std::strerror(errno));
  const std::string real_path(real);
  std::free(real);
  if (auto it = g_by_real_path.find(real_path); it != g_by_real_path.end()) {
    return g_loaded[it->second];
  }
  void* handle = ::dlopen(real_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const std::string why = ::dlerror();
    const bool unresolved = why.find("undefined symbol") != std::string::npos;
    detail::throw_error(
        origin, ": cannot load '", path, "': ", why,
        unresolved ? " (the host program must export libsdpa's symbols to plugins: link "
                     "libsdpa shared, or the static library whole-archive with -rdynamic; "
                     "CMake: ENABLE_EXPORTS ON and $<LINK_LIBRARY:WHOLE_ARCHIVE,sdpa::sdpa>)"
                   : "");
  }
  auto abi = reinterpret_cast<AbiVersionFn>(::dlsym(handle, "sdpa_backend_abi_version"));
  auto registration = reinterpret_cast<RegisterFn>(::dlsym(handle, "sdpa_backend_register"));
  if (abi == nullptr || registration == nullptr) {
    ::dlclose(handle);
    detail::throw_error(origin, ": '", path, "' is not an sdpa backend plugin (it defines no "
                        "SDPA_BACKEND_PLUGIN entry points sdpa_backend_abi_version and "
                        "sdpa_backend_register)");
  }
  if (const int version = abi(); version != SDPA_BACKEND_ABI_VERSION) {
    ::dlclose(handle);
    detail::throw_error(origin, ": '", path, "' was built for backend ABI ", version,
                        "; this library has ABI ", SDPA_BACKEND_ABI_VERSION,
                        " (rebuild the plugin against this sdpa)");
  }
  PluginRegistrar registrar(path);
  try {
    registration(registrar);
  } catch (const std::exception& e) {
    detail::throw_error(origin, ": '", path, "': registration failed: ", e.what());
  }
  LoadedBackend loaded = registrar.loaded();
  loaded.path = path;
  g_by_real_path[real_path] = g_loaded.size();
  g_loaded.push_back(loaded);
  return loaded;
}

}  // namespace

BackendHandle PluginRegistrar::register_device(DeviceInterface device) {
  BackendHandle handle = sdpa::register_device(std::move(device));
  loaded_.keys.push_back(handle.name());
  loaded_.devices.push_back(handle.device());
  return handle;
}

LoadedBackend load_backend(const std::string& path) {
  registry::ensure_env_backends();
  return load(path, "load_backend");
}

std::vector<LoadedBackend> loaded_backends() {
  registry::ensure_env_backends();
  std::lock_guard lock(g_mu);
  return g_loaded;
}

namespace registry {

void ensure_env_backends() {
  if (g_env_done.load(std::memory_order_acquire) || t_env_loading) return;
  std::lock_guard lock(g_mu);
  if (g_env_done.load()) return;
  t_env_loading = true;
  std::string errors;
  if (const char* env = std::getenv("SDPA_BACKENDS")) {
    const std::string paths(env);
    size_t start = 0;
    while (start <= paths.size()) {
      const size_t end = std::min(paths.find(':', start), paths.size());
      const std::string path = paths.substr(start, end - start);
      if (!path.empty()) {
        try {
          load(path, "SDPA_BACKENDS");
        } catch (const Error& e) {
          errors += (errors.empty() ? "" : "\n") + std::string(e.what());
        }
      }
      start = end + 1;
    }
  }
  t_env_loading = false;
  g_env_done.store(true, std::memory_order_release);
  // Reported once, at the first use; the plugins that did load stay loaded.
  if (!errors.empty()) throw Error(errors);
}

}  // namespace registry
}  // namespace sdpa
