// sdpa._C.cuda_*: CUDA availability, device descriptions and device-memory counters
// (sdpa/cuda.h). Every function exists in every build; sdpa.cuda wraps them.

#include <nanobind/stl/string.h>

#include "bindings.h"
#include "sdpa/cuda.h"

namespace sdpa::python {

void bind_cuda(nb::module_& m) {
  m.def("cuda_is_built", &cuda::is_built);
  m.def("cuda_cudnn_is_built", &cuda::cudnn_is_built);
  m.def("cuda_device_count", &cuda::device_count);
  m.def("cuda_is_available", &cuda::is_available);
  m.def("cuda_unavailable_reason", &cuda::unavailable_reason);
  m.def("cuda_device_description", &cuda::device_description, nb::arg("device"));
  m.def("cuda_memory_stats", [](int device) {
    const MemoryStats s = cuda::memory_stats(device);
    nb::dict d;
    d["current_bytes"] = s.current_bytes;
    d["peak_bytes"] = s.peak_bytes;
    return d;
  }, nb::arg("device"));
  m.def("cuda_reset_peak_memory", &cuda::reset_peak_memory, nb::arg("device"));
  m.def("cuda_graph_cache_stats", [] {
    const cuda::GraphCacheStats s = cuda::cudnn_graph_cache_stats();
    nb::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["size"] = s.size;
    d["capacity"] = s.capacity;
    return d;
  });
  // The GIL is released while the host waits: other Python threads keep running.
  m.def("cuda_synchronize", [](uintptr_t stream) {
    nb::gil_scoped_release release;
    cuda::synchronize(reinterpret_cast<cuda::Stream>(stream));
  }, nb::arg("stream"));
}

}  // namespace sdpa::python
