// Time and memory of create_block_mask at long sequence lengths (the flex issue's target:
// L = 131072 in seconds with memory in MB; PyTorch's dense creation runs out of memory
// at 96k, pytorch #134756). Memory is the peak of sdpa's allocation counters during the
// call, the BlockMask itself included.
// Usage: sdpa_block_mask_build [q_len]   (default 131072; B = H = 1, BLOCK_SIZE 128)

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "sdpa/flex.h"
#include "sdpa/flex_mods.h"

using namespace sdpa;

namespace {

void measure(const std::string& name, int64_t len, const std::function<flex::BlockMask()>& make) {
  reset_peak_memory();
  const int64_t before = memory_stats().current_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  const flex::BlockMask mask = make();
  const std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
  const double mb = static_cast<double>(memory_stats().peak_bytes - before) / (1 << 20);
  std::printf("%-22s L=S=%ld  %8.3f s  %8.1f MB  density %.5f  (dense bool mask: %.0f MB)\n",
              name.c_str(), static_cast<long>(len), s.count(), mb, mask.density(),
              static_cast<double>(len) * static_cast<double>(len) / (1 << 20));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t len = argc > 1 ? std::atoll(argv[1]) : 131072;
  measure("causal", len, [&] { return flex::create_block_mask(flex::mods::causal(), 1, 1, len, len); });
  measure("sliding_window(1024)", len, [&] {
    return flex::create_block_mask(flex::mods::sliding_window(1024), 1, 1, len, len);
  });
  Tensor ids = Tensor::empty({len}, DType::kInt64);
  for (int64_t i = 0; i < len; ++i) ids.data<int64_t>()[i] = i / 4096;
  measure("documents(4096)", len, [&] {
    return flex::create_block_mask(flex::and_masks({flex::mods::document(ids), flex::mods::causal()}),
                                   1, 1, len, len);
  });
  return 0;
}
