// `sdpa info`: the library's report (sdpa::info_text): version, CPU capability, OpenMP
// threads, loaded plugins and the state of every backend.

#include <iostream>

#include "common.h"

namespace sdpa::cli {

Command add_info_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "info", "Show the version, CPU capability, OpenMP threads, plugins and backend states");
  return {app, [] {
            std::cout << info_text();
            return kExitOk;
          }};
}

}  // namespace sdpa::cli
