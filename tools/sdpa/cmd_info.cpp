// `sdpa info`: the library's report (sdpa::info_text): version, CPU capability, OpenMP
// threads, loaded plugins and the state of every backend; with --json the same facts as
// one JSON object for scripts.

#include <omp.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common.h"
#include "sdpa/registry.h"

namespace sdpa::cli {
namespace {

// Keys as in `sdpa bench --json`'s context; per backend the verdict on info_text's probe.
nlohmann::ordered_json info_json() {
  nlohmann::ordered_json out;
  const char* env = std::getenv("SDPA_CPU_CAPABILITY");
  out["sdpa"] = version();
  out["cpu_capability"] = backends::cpu::get_cpu_capability();
  out["cpu_capability_detected"] = backends::cpu::detected_cpu_capability();
  out["sdpa_cpu_capability_env"] = env != nullptr ? nlohmann::ordered_json(env) : nullptr;
  out["amx_bf16"] = backends::cpu::amx_bf16_available();
  out["omp_threads"] = omp_get_max_threads();
  out["omp_processors"] = omp_get_num_procs();
  out["plugins"] = nlohmann::ordered_json::array();
  for (const LoadedBackend& plugin : loaded_backends()) {
    out["plugins"].push_back({{"path", plugin.path}, {"keys", plugin.keys}});
  }
  out["backends"] = nlohmann::ordered_json::array();
  for (const BackendVerdict& v : explain(probe_params()).verdicts) {
    out["backends"].push_back({{"backend", std::string(backend_name(v.backend))},
                               {"built", backend_built(v.backend)},
                               {"enabled", backend_enabled(v.backend)},
                               {"runs_probe", v.allowed && v.supported},
                               {"reasons", v.reasons}});
  }
  return out;
}

}  // namespace

Command add_info_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "info", "Show the version, CPU capability, OpenMP threads, plugins and backend states");
  auto json = std::make_shared<bool>(false);
  app->add_flag("--json", *json, "Write one JSON object instead of the text report");
  return {app, [json] {
            if (*json) {
              std::cout << info_json().dump(2) << '\n';
            } else {
              std::cout << info_text();
            }
            return kExitOk;
          }};
}

}  // namespace sdpa::cli
