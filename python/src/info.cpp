// Version, threads, memory counters and the `sdpa info` report.

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <nanobind/stl/string.h>

#include "bindings.h"

namespace sdpa::python {
namespace {

bool flag_enabled(SDPBackend backend) {
  switch (backend) {
    case SDPBackend::MATH: return backends::math_sdp_enabled();
    case SDPBackend::FLASH_ATTENTION: return backends::flash_sdp_enabled();
    case SDPBackend::EFFICIENT_ATTENTION: return backends::mem_efficient_sdp_enabled();
    case SDPBackend::CUDNN_ATTENTION: return backends::cudnn_sdp_enabled();
    case SDPBackend::OVERRIDEABLE: return backends::overrideable_sdp_enabled();
    case SDPBackend::ERROR: break;
  }
  return false;
}

// Same probe as tools/sdpa/cmd_info.cpp: a backend left out of the build says
// "built without" in its reasons for a tiny float32 CPU call.
bool reports_not_built(const BackendVerdict& verdict) {
  for (const std::string& reason : verdict.reasons) {
    if (reason.find("built without") != std::string::npos) return true;
  }
  return false;
}

std::string join_reasons(const std::vector<std::string>& reasons) {
  std::string out;
  for (const std::string& r : reasons) out += (out.empty() ? "" : "; ") + r;
  return out;
}

template <typename... Args>
void appendf(std::string& out, const char* format, Args... args) {
  char line[1024];
  std::snprintf(line, sizeof line, format, args...);
  out += line;
}

// The text `sdpa info` prints, line for line (tools/sdpa/cmd_info.cpp).
std::string info_text() {
  std::string out;
  appendf(out, "sdpa %s\n", version().c_str());
  const char* env_capability = std::getenv("SDPA_CPU_CAPABILITY");
  appendf(out, "cpu capability: %s (detected %s; SDPA_CPU_CAPABILITY=%s)\n",
          backends::cpu::get_cpu_capability().c_str(),
          backends::cpu::detected_cpu_capability().c_str(),
          env_capability != nullptr ? env_capability : "unset");
  appendf(out, "openmp: %d threads (%d processors)\n", omp_get_max_threads(), omp_get_num_procs());

  const Tensor probe = Tensor::empty({1, 1, 1, 8}, DType::kFloat32);
  const Explanation e = explain(make_params(probe, probe, probe));
  appendf(out, "\nbackends in priority order (probe: a float32 cpu call):\n");
  appendf(out, "  %-20s %-6s %-8s %s\n", "backend", "built", "enabled", "probe");
  for (const SDPBackend backend : default_priority_order()) {
    const BackendVerdict* verdict = nullptr;
    for (const BackendVerdict& v : e.verdicts) {
      if (v.backend == backend) verdict = &v;
    }
    const bool usable = verdict != nullptr && verdict->allowed && verdict->supported;
    const std::string probe_text =
        usable ? "runs it" : verdict ? "no: " + join_reasons(verdict->reasons) : "no verdict";
    appendf(out, "  %-20s %-6s %-8s %s\n", std::string(backend_name(backend)).c_str(),
            verdict && reports_not_built(*verdict) ? "no" : "yes",
            flag_enabled(backend) ? "yes" : "no", probe_text.c_str());
  }
  return out;
}

}  // namespace

void bind_info(nb::module_& m) {
  m.def("version", &version, "Library version, \"MAJOR.MINOR.PATCH\".");
  m.def("info", &info_text, "The report `sdpa info` prints.");
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
    return d;
  }, "Bytes the library holds in allocated storage: now and the peak since the last reset.");
  m.def("reset_peak_memory", &reset_peak_memory);
}

}  // namespace sdpa::python
