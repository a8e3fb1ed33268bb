#pragma once
// Kernel scratch arrays allocated through Storage, so memory_stats() (and the extra
// memory `sdpa bench` reports) counts them like tensors.

#include <cstdint>
#include <type_traits>

#include "sdpa/tensor.h"

namespace sdpa::detail {

/// `n` float or double elements, zero-initialized, 64-byte aligned.
template <typename T>
class ScratchArray {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);

 public:
  explicit ScratchArray(int64_t n)
      : buffer_(Tensor::zeros({n}, std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64)),
        data_(buffer_.data<T>()),
        size_(n) {}

  T* data() const { return data_; }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }
  T& operator[](int64_t i) const { return data_[i]; }

 private:
  Tensor buffer_;
  T* data_;
  int64_t size_;
};

}  // namespace sdpa::detail
