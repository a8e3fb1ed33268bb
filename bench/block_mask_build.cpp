// Time and memory of create_block_mask at long sequence lengths (the flex issue's target:
// L = 131072 in seconds with memory in MB; PyTorch's dense creation runs out of memory
// at 96k, pytorch #134756). Time is the median of 5 calls (the first, which also traces
// and compiles the program and touches the lists' fresh pages, reported beside it);
// memory is the peak of sdpa's allocation counters during a call, the BlockMask itself
// included.
// Usage: sdpa_block_mask_build [q_len] [--json FILE]   (default 131072; B = H = 1, BLOCK_SIZE 128)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "host.h"
#include "sdpa/flex.h"
#include "sdpa/flex_mods.h"

using namespace sdpa;

namespace {

// Prints one line and returns the same figures as a JSON row.
nlohmann::ordered_json measure(const std::string& name, int64_t len,
                               const std::function<flex::BlockMask()>& make) {
  constexpr int kCalls = 5;
  std::vector<double> seconds;
  double mb = 0.0, density = 0.0;
  for (int call = 0; call < kCalls; ++call) {
    reset_peak_memory();
    const int64_t before = memory_stats().current_bytes;
    const auto t0 = std::chrono::steady_clock::now();
    const flex::BlockMask mask = make();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    mb = std::max(mb, static_cast<double>(memory_stats().peak_bytes - before) / (1 << 20));
    density = mask.density();
  }
  const double first = seconds.front();
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[kCalls / 2];
  std::printf("%-22s L=S=%ld  %8.4f s (first call %.4f s)  %8.1f MB  density %.5f  (dense bool "
              "mask: %.0f MB)\n",
              name.c_str(), static_cast<long>(len), median, first, mb, density,
              static_cast<double>(len) * static_cast<double>(len) / (1 << 20));
  return {{"mask_mod", name},
          {"q_len", len},
          {"kv_len", len},
          {"seconds", median},
          {"first_call_seconds", first},
          {"peak_mb", mb},
          {"density", density},
          {"dense_bool_mask_mb", static_cast<double>(len) * static_cast<double>(len) / (1 << 20)}};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = bench::command_line(argc, argv);
  const std::string json_path = bench::take_json_path(argc, argv);
  const int64_t len = argc > 1 ? std::atoll(argv[1]) : 131072;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  results.push_back(measure(
      "causal", len, [&] { return flex::create_block_mask(flex::mods::causal(), 1, 1, len, len); }));
  results.push_back(measure("sliding_window(1024)", len, [&] {
    return flex::create_block_mask(flex::mods::sliding_window(1024), 1, 1, len, len);
  }));
  Tensor ids = Tensor::empty({len}, DType::kInt64);
  for (int64_t i = 0; i < len; ++i) ids.data<int64_t>()[i] = i / 4096;
  results.push_back(measure("documents(4096)", len, [&] {
    return flex::create_block_mask(flex::and_masks({flex::mods::document(ids), flex::mods::causal()}),
                                   1, 1, len, len);
  }));
  if (json_path.empty()) return 0;
  const nlohmann::ordered_json config = {{"batch", 1}, {"heads", 1}, {"block_size", 128}};
  return bench::write_json(json_path, "block_mask_build", command, config, results) ? 0 : 1;
}
