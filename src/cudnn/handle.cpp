// cuDNN itself (loaded at run time: the library needs libcudnn only where the CUDNN
// backend runs) and its handles (creating one costs milliseconds, so each thread keeps one
// per device).

#include "cudnn/handle.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "cuda/status.h"
#include "sdpa/error.h"

// The frontend's calls into cuDNN go through this handle (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace sdpa::cudnn {
namespace {

struct BoundHandle {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;  // the stream it was last bound to
};

struct Handles {
  std::unordered_map<int, BoundHandle> by_device;
  ~Handles() {
    for (auto& [device, bound] : by_device) cudnn_frontend::detail::destroy_handle(bound.handle);
  }
};

// Loads cuDNN once: SDPA_CUDNN_LIBRARY names the file, else libcudnn.so.9 from the loader's
// search path. Returns "" or why it could not be loaded.
const std::string& load_error() {
  static const std::string error = [] {
    const char* named = std::getenv("SDPA_CUDNN_LIBRARY");
    const char* library = named != nullptr && *named != '\0' ? named : "libcudnn.so.9";
    cudnn_frontend::cudnn_dlhandle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (cudnn_frontend::cudnn_dlhandle != nullptr) return std::string();
    const char* why = dlerror();
    return std::string("cuDNN could not be loaded (") + library + ": " +
           (why != nullptr ? why : "unknown error") +
           "); install cuDNN 9 (e.g. pip install nvidia-cudnn-cu13) or set SDPA_CUDNN_LIBRARY";
  }();
  return error;
}

}  // namespace

const std::string& cudnn_load_error() { return load_error(); }

void check(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS) {
    sdpa::detail::throw_error(call, ": ", cudnn_frontend::detail::get_error_string(status));
  }
}

cudnnHandle_t handle_for(int device, cudaStream_t stream) {
  SDPA_CHECK(load_error().empty(), load_error());
  thread_local Handles handles;
  auto it = handles.by_device.find(device);
  if (it == handles.by_device.end()) {
    cuda::detail::DeviceGuard guard(device);
    cudnnHandle_t handle = nullptr;
    check(cudnn_frontend::detail::create_handle(&handle), "cudnnCreate");
    check(cudnn_frontend::detail::set_stream(handle, stream), "cudnnSetStream");
    it = handles.by_device.emplace(device, BoundHandle{handle, stream}).first;
  }
  // Rebinding costs a driver call per call; a thread keeps to one stream for long runs.
  if (it->second.stream != stream) {
    check(cudnn_frontend::detail::set_stream(it->second.handle, stream), "cudnnSetStream");
    it->second.stream = stream;
  }
  return it->second.handle;
}

}  // namespace sdpa::cudnn
