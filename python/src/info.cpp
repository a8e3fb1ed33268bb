// Version, threads, memory counters and the `sdpa info` report.

#include <omp.h>

#include <string>

#include <nanobind/stl/string.h>

#include "bindings.h"

namespace sdpa::python {

void bind_info(nb::module_& m) {
  m.def("version", &version, "Library version, \"MAJOR.MINOR.PATCH\".");
  m.def("info", &info_text, "The report `sdpa info` prints (sdpa::info_text).");
  m.def("get_num_threads", [] { return omp_get_max_threads(); },
        "OpenMP threads a parallel region started from this thread uses.");
  m.def("set_num_threads", [](int n) {
    if (n < 1) throw nb::value_error("set_num_threads: expected n >= 1");
    omp_set_num_threads(n);
  }, nb::arg("n"), "Sets the OpenMP threads of this thread's later parallel regions.");
  m.def("memory_stats", [] {
    const MemoryStats s = memory_stats();
    nb::dict d;
    d["current_bytes"] = s.current_bytes;
    d["peak_bytes"] = s.peak_bytes;
    d["cached_bytes"] = s.cached_bytes;
    return d;
  }, "Bytes the library holds in allocated storage: now and the peak since the last reset, "
     "and freed blocks of 2 MiB or more kept for reuse (cached_bytes).");
  m.def("reset_peak_memory", &reset_peak_memory);
  m.def("empty_cache", &empty_cache, "Returns the cached blocks to the system.");
}

}  // namespace sdpa::python
