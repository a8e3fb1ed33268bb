#pragma once
// What every benchmark's JSON records about where and how it ran, so that
// bench/render_benchmarks.py can group results by host and print the command above each
// table. Shared by the programs in bench/ and by `sdpa bench` (tools/sdpa), which lists
// these fields in its context.

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "sdpa/backend.h"

namespace sdpa::bench {

/// The CPU's "model name" from /proc/cpuinfo, or "unknown" where there is none.
inline std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  const std::string key = "model name";
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.compare(0, key.size(), key) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(' ', colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return "unknown";
}

/// Whether the CPU has avx512_bf16 (vdpbf16ps): bfloat16 rows then run on it and are
/// compared with its peak rather than the fp32 FMA peak.
inline bool has_avx512_bf16() { return __builtin_cpu_supports("avx512bf16"); }

/// The arguments joined by spaces, as typed (none of ours need quoting).
inline std::string command_line(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) line += (i ? " " : "") + std::string(argv[i]);
  return line;
}

/// {"cpu_model", "cpu_capability", "avx512_bf16", "amx_bf16", "threads"}: the host of one
/// run.
inline nlohmann::ordered_json host_json() {
  return {{"cpu_model", cpu_model_name()},
          {"cpu_capability", backends::cpu::get_cpu_capability()},
          {"avx512_bf16", has_avx512_bf16()},
          {"amx_bf16", backends::cpu::amx_bf16_available()},
          {"threads", omp_get_max_threads()}};
}

/// Removes "--json FILE" from argv (the programs' other arguments are positional) and
/// returns FILE, or "" when the flag is absent. Exits with code 2 when FILE is missing.
inline std::string take_json_path(int& argc, char** argv) {
  std::string path;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json") {
      if (i + 1 == argc) {
        std::fprintf(stderr, "%s: --json needs a file name\n", argv[0]);
        std::exit(2);
      }
      path = argv[++i];
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return path;
}

/// The document a bench program writes with --json: what ran, where, and its results.
/// `command` must be taken before take_json_path() edits argv. Returns false (after a
/// message) when the file cannot be written.
inline bool write_json(const std::string& path, const std::string& benchmark,
                       const std::string& command, nlohmann::ordered_json config,
                       nlohmann::ordered_json results) {
  const nlohmann::ordered_json doc = {{"benchmark", benchmark},
                                      {"command", command},
                                      {"host", host_json()},
                                      {"config", std::move(config)},
                                      {"results", std::move(results)}};
  std::ofstream file(path);
  file << doc.dump(1) << '\n';
  if (!file) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return static_cast<bool>(file);
}

}  // namespace sdpa::bench
