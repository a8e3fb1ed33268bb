// backend_built, backend_enabled and the `sdpa info` report.

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "sdpa/cuda.h"
#include "sdpa/registry.h"
#include "sdpa/sdpa.h"

namespace sdpa {

bool backend_built(SDPBackend backend) {
  switch (backend) {
    case SDPBackend::MATH:
    case SDPBackend::FLASH_ATTENTION:
    case SDPBackend::OVERRIDEABLE: return true;
    case SDPBackend::CUDNN_ATTENTION: return cuda::cudnn_is_built();
    case SDPBackend::EFFICIENT_ATTENTION:
    case SDPBackend::ERROR: break;
  }
  return false;
}

bool backend_enabled(SDPBackend backend) {
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

namespace {

const char* env_or_unset(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "unset";
}

}  // namespace

std::string info_text() {
  std::ostringstream os;
  os << "sdpa " << version() << "\n"
     << "cpu capability: " << backends::cpu::get_cpu_capability() << " (detected "
     << backends::cpu::detected_cpu_capability()
     << "; SDPA_CPU_CAPABILITY=" << env_or_unset("SDPA_CPU_CAPABILITY") << ")\n"
     << "amx bf16: " << (backends::cpu::amx_bf16_available() ? "yes" : "no")
     << " (SDPA_DISABLE_AMX=" << env_or_unset("SDPA_DISABLE_AMX") << ")\n"
     << "openmp: " << get_num_threads() << " threads at most per call (" << omp_get_num_procs()
     << " processors; set_num_threads, else OMP_NUM_THREADS=" << env_or_unset("OMP_NUM_THREADS")
     << "; OMP_WAIT_POLICY=" << env_or_unset("OMP_WAIT_POLICY") << ")\n";
  os << "cuda: " << (cuda::is_built() ? "built" : "not built");
  if (cuda::is_built()) {
    os << ", " << cuda::device_count() << " device(s)";
    if (!cuda::is_available()) os << " (" << cuda::unavailable_reason() << ")";
    for (int d = 0; d < cuda::device_count(); ++d) os << "\n  cuda:" << d << " " << cuda::device_description(d);
    const cuda::GraphCacheStats g = cuda::cudnn_graph_cache_stats();
    os << "\ncudnn backend: " << (cuda::cudnn_is_built() ? "built" : "not built")
       << "; graph cache " << g.size << "/" << g.capacity << " graphs, " << g.hits << " hits, "
       << g.misses << " misses";
    os << "\nflex programs for CUDA kernels: " << cuda::runtime_compiler_description();
  }
  os << "\n";
  const std::vector<LoadedBackend> plugins = loaded_backends();
  os << "plugins:" << (plugins.empty() ? " none (load with SDPA_BACKENDS)" : "") << "\n";
  for (const LoadedBackend& plugin : plugins) {
    os << "  " << plugin.path << ":";
    for (const std::string& key : plugin.keys) os << " " << key;
    os << "\n";
  }

  const Tensor probe = Tensor::empty({1, 1, 1, 8}, DType::kFloat32);
  const Explanation e = explain(make_params(probe, probe, probe));
  os << "\nbackends in priority order (probe: a float32 cpu call):\n";
  char line[64];
  std::snprintf(line, sizeof(line), "  %-20s %-6s %-8s ", "backend", "built", "enabled");
  os << line << "probe\n";
  for (const BackendVerdict& v : e.verdicts) {
    std::snprintf(line, sizeof(line), "  %-20s %-6s %-8s ",
                  std::string(backend_name(v.backend)).c_str(),
                  backend_built(v.backend) ? "yes" : "no", backend_enabled(v.backend) ? "yes" : "no");
    os << line;
    if (v.allowed && v.supported) {
      os << "runs it";
    } else {
      os << "no: ";
      for (size_t i = 0; i < v.reasons.size(); ++i) os << (i ? "; " : "") << v.reasons[i];
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace sdpa
