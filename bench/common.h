#pragma once
// Shared helpers of the benchmark programs: random inputs and paired timing.

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa::bench {

/// Standard-normal tensor of `shape` (never zeros: zeros hide masking and softmax bugs).
inline Tensor randn(const Shape& shape, DType dtype, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  float* d = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) d[i] = normal(gen);
  return dtype == DType::kFloat32 ? t : t.to(dtype);
}

/// Median milliseconds of each function, run interleaved (round-robin, `rounds` times
/// after one warm-up round) so that machine noise hits all of them alike and their ratios
/// are meaningful.
inline std::vector<double> paired_median_ms(const std::vector<std::function<void()>>& fns,
                                            int rounds) {
  std::vector<std::vector<double>> times(fns.size());
  for (int r = -1; r < rounds; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      fns[i]();
      const auto t1 = std::chrono::steady_clock::now();
      if (r >= 0) times[i].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  std::vector<double> medians;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  return medians;
}

}  // namespace sdpa::bench
