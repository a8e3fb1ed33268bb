#pragma once
// The one header a backend plugin includes. A plugin is a shared library that defines
//
//   SDPA_BACKEND_PLUGIN(registrar) {
//     sdpa::BackendHandle arena = registrar.register_device({"arena", alloc, free, ...});
//     arena.impl(sdpa::op::attention, &my_attention)
//          .add_check("dtype", &my_dtype_check);
//   }
//
// and is loaded by sdpa::load_backend(path) or the SDPA_BACKENDS environment variable
// (colon-separated paths, loaded once at the first use of the library). Its symbols
// resolve against the host's libsdpa; it must not link its own copy. See
// docs/backend_guide.md and examples/external_backend/.

#include <string>
#include <utility>

#include "sdpa/registry.h"

/// Bumped whenever a change to the registry headers breaks compiled plugins; load_backend
/// refuses a plugin built for another value.
#define SDPA_BACKEND_ABI_VERSION 1

namespace sdpa {

/// What a plugin's registration function receives: registers devices on behalf of the
/// plugin (so loaded_backends() can say which plugin brought which device).
class PluginRegistrar {
 public:
  explicit PluginRegistrar(std::string path) : path_(std::move(path)) {}
  /// sdpa::register_device, recorded for this plugin.
  BackendHandle register_device(DeviceInterface device);
  const std::string& path() const { return path_; }
  const LoadedBackend& loaded() const { return loaded_; }

 private:
  std::string path_;
  LoadedBackend loaded_;
};

}  // namespace sdpa

#define SDPA_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

/// Defines the plugin's entry points: its ABI version and its registration function, whose
/// body follows the macro with `registrar` (a sdpa::PluginRegistrar&) in scope.
#define SDPA_BACKEND_PLUGIN(registrar)                                              \
  SDPA_PLUGIN_EXPORT int sdpa_backend_abi_version() { return SDPA_BACKEND_ABI_VERSION; } \
  SDPA_PLUGIN_EXPORT void sdpa_backend_register(::sdpa::PluginRegistrar& registrar)
