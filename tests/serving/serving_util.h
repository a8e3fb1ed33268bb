#pragma once
// Inputs of the serving tests: normal random tensors (never zeros) and int32 index
// tensors (cache lengths, block tables, offsets).

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

/// An int32 tensor of `shape` (default: 1-D) holding `values` (row-major).
inline Tensor int32s(const std::vector<int32_t>& values, const Shape& shape = {}) {
  Tensor t = Tensor::empty(shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape,
                           DType::kInt32);
  std::memcpy(t.data<int32_t>(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

}  // namespace sdpa::serving_test
