#pragma once
// Scalar load/store of one element of any dtype as double: for tools, copies and the
// MATH reference, never for the fused kernels' inner loops.

#include <cstdint>

#include "sdpa/dtype.h"

namespace sdpa::detail {

inline double load_element(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base)[offset];
    case DType::kFloat64: return static_cast<const double*>(base)[offset];
    case DType::kBFloat16:
      return static_cast<float>(static_cast<const bfloat16*>(base)[offset]);
    case DType::kFloat16: return static_cast<float>(static_cast<const float16*>(base)[offset]);
    case DType::kBool: return static_cast<const bool*>(base)[offset] ? 1.0 : 0.0;
    case DType::kInt32: return static_cast<const int32_t*>(base)[offset];
    case DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(base)[offset]);
    case DType::kFloat8E4M3FN:
      return static_cast<float>(static_cast<const float8_e4m3fn*>(base)[offset]);
  }
  return 0.0;
}

inline void store_element(void* base, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case DType::kFloat32: static_cast<float*>(base)[offset] = static_cast<float>(value); break;
    case DType::kFloat64: static_cast<double*>(base)[offset] = value; break;
    case DType::kBFloat16:
      static_cast<bfloat16*>(base)[offset] = bfloat16(static_cast<float>(value));
      break;
    case DType::kFloat16:
      static_cast<float16*>(base)[offset] = float16(static_cast<float>(value));
      break;
    case DType::kBool: static_cast<bool*>(base)[offset] = value != 0.0; break;
    case DType::kInt32: static_cast<int32_t*>(base)[offset] = static_cast<int32_t>(value); break;
    case DType::kInt64: static_cast<int64_t*>(base)[offset] = static_cast<int64_t>(value); break;
    case DType::kFloat8E4M3FN:
      static_cast<float8_e4m3fn*>(base)[offset] = float8_e4m3fn(static_cast<float>(value));
      break;
  }
}

}  // namespace sdpa::detail
