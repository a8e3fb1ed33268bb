// Seconds to compile CUDA FLASH's forward kernel with a flex program through NVRTC
// (issue 24: a program compiles in <= 1 s; a cached one costs nothing after the first
// call). Each unit is compiled once into an empty disk cache (the cold cost a program pays
// on its first call on a machine), then asked for again by a re-traced program of the
// same structure (the lookup every later call pays: flex_forward_module). NVRTC runs on
// the CPU: no GPU is needed.
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
  const flex::Program soft_cap = flex::Program::from_score_mod(flex::mods::soft_cap(30.0));
  const flex::Program causal = flex::Program::from_mask_mod(flex::mods::causal());
  const int arch = 90;
  std::printf("NVRTC %d, sm_%d, bfloat16 units of soft_cap(30) + causal\n", cuda::nvrtc_version(),
              arch);
  std::printf("%-13s %12s %14s %20s\n", "head-dim tile", "cold s", "cached us",
              "retrace + cached us");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  constexpr int kLookups = 1000;
  for (int tile : {32, 64, 128, 256}) {
    const auto t0 = std::chrono::steady_clock::now();
    cuda::flash::flex_forward_module(&soft_cap, &causal, DType::kBFloat16, tile, arch);
    const auto t1 = std::chrono::steady_clock::now();
    for (int n = 0; n < kLookups; ++n) {
      cuda::flash::flex_forward_module(&soft_cap, &causal, DType::kBFloat16, tile, arch);
    }
    const auto t2 = std::chrono::steady_clock::now();
    // A Python mod is traced on every call: the program again, then the lookup.
    for (int n = 0; n < kLookups; ++n) {
      const flex::Program again = flex::Program::from_score_mod(flex::mods::soft_cap(30.0));
      cuda::flash::flex_forward_module(&again, &causal, DType::kBFloat16, tile, arch);
    }
    const auto t3 = std::chrono::steady_clock::now();
    const auto per_call_us = [](auto from, auto to) {
      return std::chrono::duration<double, std::micro>(to - from).count() / kLookups;
    };
    const double cold_s = std::chrono::duration<double>(t1 - t0).count();
    const double cached_us = per_call_us(t1, t2), retraced_us = per_call_us(t2, t3);
    std::printf("%-13d %12.3f %14.2f %20.2f\n", tile, cold_s, cached_us, retraced_us);
    rows.push_back({{"head_dim_tile", tile},
                    {"cold_s", cold_s},
                    {"cached_us", cached_us},
                    {"retrace_and_cached_us", retraced_us}});
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
