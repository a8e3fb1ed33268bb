#pragma once
// sdpa::Shape: a tensor's sizes or strides, held inline.
//
// Every Tensor carries two of these, and a call copies tensors into its parameters, makes
// outputs and views: as std::vector that was two heap allocations per tensor copy, most of
// a tiny attention call's 30 allocations (issue 27). Holding the dimensions inline, as
// PyTorch's c10::SmallVector does for its sizes, makes a copy a few stores.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <type_traits>
#include <vector>

namespace sdpa {

namespace detail {
[[noreturn]] void throw_too_many_dims(size_t dims);
}  // namespace detail

/// Sizes or strides of up to Shape::kMaxDims dimensions, with std::vector<int64_t>'s
/// interface for what tensors need (construction from a list, an iterator range or a
/// vector; indexing; iteration; push_back/insert/erase/resize). Growing past kMaxDims
/// throws sdpa::Error naming the rank.
class Shape {
 public:
  using value_type = int64_t;
  using iterator = int64_t*;
  using const_iterator = const int64_t*;

  /// More dimensions than any attention tensor, mask or bias has (PyTorch's own inline
  /// size for tensor shapes is 5).
  static constexpr size_t kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign_range(dims.begin(), dims.end()); }
  explicit Shape(size_t count, int64_t value = 0) { resize(count, value); }
  template <class InputIt>
    requires(!std::is_integral_v<InputIt>)
  Shape(InputIt first, InputIt last) {
    assign_range(first, last);
  }
  Shape(std::span<const int64_t> dims) { assign_range(dims.begin(), dims.end()); }  // NOLINT
  Shape(const std::vector<int64_t>& dims) { assign_range(dims.begin(), dims.end()); }  // NOLINT

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* data() { return dims_.data(); }
  const int64_t* data() const { return dims_.data(); }
  int64_t& operator[](size_t i) { return dims_[i]; }
  int64_t operator[](size_t i) const { return dims_[i]; }
  iterator begin() { return dims_.data(); }
  iterator end() { return dims_.data() + size_; }
  const_iterator begin() const { return dims_.data(); }
  const_iterator end() const { return dims_.data() + size_; }
  int64_t& front() { return dims_[0]; }
  int64_t front() const { return dims_[0]; }
  int64_t& back() { return dims_[size_ - 1]; }
  int64_t back() const { return dims_[size_ - 1]; }

  void clear() { size_ = 0; }
  void assign(size_t count, int64_t value) {
    size_ = 0;
    resize(count, value);
  }
  void push_back(int64_t value) {
    grow_to(size_ + 1);
    dims_[size_++] = value;
  }
  void pop_back() { --size_; }
  void resize(size_t count, int64_t value = 0) {
    grow_to(count);
    std::fill(dims_.data() + std::min(size_, count), dims_.data() + count, value);
    size_ = count;
  }
  iterator insert(const_iterator pos, int64_t value) {
    const size_t at = static_cast<size_t>(pos - begin());
    grow_to(size_ + 1);
    std::copy_backward(dims_.data() + at, dims_.data() + size_, dims_.data() + size_ + 1);
    dims_[at] = value;
    ++size_;
    return begin() + at;
  }
  iterator erase(const_iterator pos) {
    const size_t at = static_cast<size_t>(pos - begin());
    std::copy(dims_.data() + at + 1, dims_.data() + size_, dims_.data() + at);
    --size_;
    return begin() + at;
  }

  /// The dimensions as a std::vector (for APIs that take one).
  std::vector<int64_t> to_vector() const { return {begin(), end()}; }
  operator std::span<const int64_t>() const { return {begin(), end()}; }  // NOLINT

  friend bool operator==(const Shape& a, const Shape& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  template <class InputIt>
  void assign_range(InputIt first, InputIt last) {
    size_ = 0;
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }
  void grow_to(size_t count) const {
    if (count > kMaxDims) detail::throw_too_many_dims(count);
  }

  std::array<int64_t, kMaxDims> dims_{};
  size_t size_ = 0;
};

}  // namespace sdpa
