// `sdpa info`: version, CPU capability, OpenMP threads and the state of every backend.

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.h"

namespace sdpa::cli {
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

// The public API has no "is this backend compiled in" query, so ask the checks about a
// tiny float32 CPU call: a backend left out of the build says so in its reasons.
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

int run_info() {
  std::printf("sdpa %s\n", version().c_str());
  const char* env_capability = std::getenv("SDPA_CPU_CAPABILITY");
  std::printf("cpu capability: %s (detected %s; SDPA_CPU_CAPABILITY=%s)\n",
              backends::cpu::get_cpu_capability().c_str(),
              backends::cpu::detected_cpu_capability().c_str(),
              env_capability != nullptr ? env_capability : "unset");
  std::printf("openmp: %d threads (%d processors)\n", omp_get_max_threads(), omp_get_num_procs());

  const Shape shape = {1, 1, 1, 8};
  const Tensor probe = Tensor::empty(shape, DType::kFloat32);
  const Explanation e = explain(make_params(probe, probe, probe));
  std::printf("\nbackends in priority order (probe: a float32 cpu call):\n");
  std::printf("  %-20s %-6s %-8s %s\n", "backend", "built", "enabled", "probe");
  for (const SDPBackend backend : default_priority_order()) {
    const BackendVerdict* verdict = nullptr;
    for (const BackendVerdict& v : e.verdicts) {
      if (v.backend == backend) verdict = &v;
    }
    const bool usable = verdict != nullptr && verdict->allowed && verdict->supported;
    const std::string probe_text =
        usable ? "runs it" : verdict ? "no: " + join_reasons(verdict->reasons) : "no verdict";
    std::printf("  %-20s %-6s %-8s %s\n", std::string(backend_name(backend)).c_str(),
                verdict && reports_not_built(*verdict) ? "no" : "yes",
                flag_enabled(backend) ? "yes" : "no", probe_text.c_str());
  }
  return kExitOk;
}

}  // namespace

Command add_info_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "info", "Show the version, CPU capability, OpenMP threads and backend states");
  return {app, [] { return run_info(); }};
}

}  // namespace sdpa::cli
