#pragma once
// Inputs of the serving tests: normal random tensors (never zeros) and int32 index
// tensors (cache lengths, block tables, offsets); the comparison of two results.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sdpa/tensor.h"

namespace sdpa::serving_test {

/// Standard-normal values drawn in float64, stored as `dtype`.
inline Tensor randn(const Shape& shape, uint32_t seed, DType dtype = DType::kFloat32) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = normal(rng);
  return t.to(dtype);
}

/// The largest |a - b| over the elements (a NaN against a number counts 1e30; equal
/// infinities 0).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::kFloat64).contiguous(), y = b.to(DType::kFloat64).contiguous();
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u = x.data<double>()[i], v = y.data<double>()[i];
    if (std::isinf(u) && u == v) continue;
    worst = std::max(worst, std::isnan(u) != std::isnan(v) ? 1e30 : std::abs(u - v));
  }
  return worst;
}

/// An int32 tensor of `shape` (default: 1-D) holding `values` (row-major).
inline Tensor int32s(const std::vector<int32_t>& values, const Shape& shape = {}) {
  Tensor t = Tensor::empty(shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape,
                           DType::kInt32);
  std::memcpy(t.data<int32_t>(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

}  // namespace sdpa::serving_test
