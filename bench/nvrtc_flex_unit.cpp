// Seconds to compile CUDA FLASH's forward kernel with a flex program through NVRTC
// (issue 24: a program compiles in <= 1 s; a cached one costs nothing after the first
// call). Each unit is compiled once into an empty disk cache (the cold cost a program pays
// on its first call on a machine), then asked for again (the in-memory hit every later
// call pays). NVRTC runs on the CPU: no GPU is needed.
//
// Usage: sdpa_nvrtc_flex_unit [--json FILE]

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cuda/flash/flex_unit.h"
#include "cuda/nvrtc.h"
#include "host.h"
#include "sdpa/flex_mods.h"

using namespace sdpa;

int main(int argc, char** argv) {
  const std::string command = bench::command_line(argc, argv);
  const std::string json_path = bench::take_json_path(argc, argv);
  if (!cuda::nvrtc_load_error().empty() || cuda::cuda_include_dir().empty()) {
    std::printf("no NVRTC or CUDA headers: %s\n", cuda::nvrtc_load_error().c_str());
    return 0;
  }
  const std::filesystem::path cache =
      std::filesystem::temp_directory_path() / ("sdpa_nvrtc_bench_" + std::to_string(::getpid()));
  setenv("SDPA_CACHE_DIR", cache.c_str(), 1);
  const std::vector<std::string> options = {"-I" + cuda::cuda_include_dir()};
  const flex::Program soft_cap = flex::Program::from_score_mod(flex::mods::soft_cap(30.0));
  const flex::Program causal = flex::Program::from_mask_mod(flex::mods::causal());
  const int arch = 90;
  std::printf("NVRTC %d, sm_%d, bfloat16 units of soft_cap(30) + causal\n", cuda::nvrtc_version(),
              arch);
  std::printf("%-13s %12s %14s\n", "head-dim tile", "cold s", "cached us");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int tile : {32, 64, 128, 256}) {
    const std::string unit =
        cuda::flash::flex_forward_unit(&soft_cap, &causal, DType::kBFloat16, tile);
    const auto t0 = std::chrono::steady_clock::now();
    cuda::compile_cubin(unit, arch, options);
    const auto t1 = std::chrono::steady_clock::now();
    cuda::compile_cubin(unit, arch, options);
    const auto t2 = std::chrono::steady_clock::now();
    const double cold_s = std::chrono::duration<double>(t1 - t0).count();
    const double cached_us = std::chrono::duration<double, std::micro>(t2 - t1).count();
    std::printf("%-13d %12.3f %14.1f\n", tile, cold_s, cached_us);
    rows.push_back({{"head_dim_tile", tile}, {"cold_s", cold_s}, {"cached_us", cached_us}});
  }
  std::filesystem::remove_all(cache);
  if (json_path.empty()) return 0;
  const nlohmann::ordered_json config = {{"dtype", "bfloat16"},
                                         {"arch", arch},
                                         {"nvrtc_version", cuda::nvrtc_version()},
                                         {"program", "soft_cap(30) + causal"}};
  const nlohmann::ordered_json results = {{"units", rows}};
  return bench::write_json(json_path, "nvrtc_flex_unit", command, config, results) ? 0 : 1;
}
