// Version, threads, memory counters and the `sdpa info` report.

#include <string>

#include <nanobind/stl/string.h>

#include "bindings.h"

namespace sdpa::python {

void bind_info(nb::module_& m) {
  m.def("version", &version, "Library version, \"MAJOR.MINOR.PATCH\".");
  m.def("info", &info_text, "The report `sdpa info` prints (sdpa::info_text).");
  m.def("get_num_threads", &get_num_threads,
        "The most threads a call started on this thread uses (sdpa::get_num_threads).");
  m.def("set_num_threads", &set_num_threads, nb::arg("n"),
        "Sets the most threads (>= 1) one call uses, for every thread of the process; a "
        "call uses fewer when its work repays fewer. sdpa.Error (a ValueError) when n < 1 "
        "(sdpa::set_num_threads).");
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
