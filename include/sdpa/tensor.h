#pragma once
// sdpa::Tensor: a small owning, strided, ref-counted tensor (PyTorch-like semantics for
// views: every view shares storage with its base).

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sdpa/dtype.h"
#include "sdpa/shape.h"

namespace sdpa {

/// Alignment in bytes of every buffer the library allocates (one cache line, and the
/// widest SIMD load on AVX-512).
inline constexpr size_t kAlignment = 64;

/// A reference-counted block of memory. Allocated blocks are 64-byte aligned and counted
/// in memory_stats(); imported blocks (from_blob, DLPack) are not counted.
class Storage {
 public:
  /// Allocates `nbytes` on the CPU, 64-byte aligned. Throws sdpa::Error when out of memory.
  static std::shared_ptr<Storage> allocate(size_t nbytes);
  /// Wraps memory owned elsewhere; `release` (may be empty) runs when the last reference
  /// goes.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device,
                                       std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  // Only allocate() and wrap() construct; the key lets them use std::make_shared (one
  // allocation for the Storage and its reference count).
  struct Key {
    explicit Key() = default;
  };

 public:
  explicit Storage(Key) {}

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_{};
  bool owned_ = false;
  std::function<void()> release_;
};

/// Bytes the library holds in allocated storage: now and the peak since the last reset.
struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  /// Freed blocks of 2 MiB or more kept for reuse (not in current/peak): re-faulting
  /// fresh pages costs a sparse attention call about a tenth of its time. At most 512 MiB.
  int64_t cached_bytes = 0;
};
/// Process-wide allocation counters (Tensor storage and kernel scratch).
MemoryStats memory_stats();
/// Sets the peak to the current value, so a following call's extra memory can be read.
void reset_peak_memory();
/// Returns the cached blocks (MemoryStats::cached_bytes) to the system.
void empty_cache();

/// An n-dimensional strided view of a Storage. Strides are in elements and may be zero
/// (broadcast) or any permutation (BHSD, BSHD, transposed views). A default-constructed
/// Tensor is "undefined" (used for absent optional inputs).
class Tensor {
 public:
  Tensor() = default;

  /// Allocates a contiguous (row-major) tensor with uninitialized contents.
  static Tensor empty(const Shape& shape, DType dtype);
  /// Allocates a contiguous tensor filled with zeros.
  static Tensor zeros(const Shape& shape, DType dtype);
  /// Allocates a contiguous tensor with every element set to `value` (cast to dtype).
  static Tensor full(const Shape& shape, double value, DType dtype);
  /// Wraps external memory without copying. Strides are in elements; `owner` keeps the
  /// memory alive (may be null when the caller guarantees the lifetime). Throws
  /// sdpa::Error when sizes are negative or the extent overflows int64. Shapes are taken
  /// by value, so callers that build them (DLPack imports) move them in without a copy.
  static Tensor from_blob(void* data, Shape shape, Shape strides, DType dtype,
                          Device device = {}, std::shared_ptr<void> owner = nullptr);

  bool defined() const { return storage_ != nullptr; }
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  const Shape& sizes() const { return sizes_; }
  const Shape& strides() const { return strides_; }
  /// Size of dimension `d`; negative `d` counts from the end. Throws for d out of range.
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  /// Address of the first element (storage base + offset).
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  int64_t storage_offset() const { return offset_; }
  bool is_contiguous() const;

  // Views (share storage). Dimension arguments may be negative.
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(int64_t d) const;
  Tensor select(int64_t d, int64_t index) const;
  /// Elements [start, end) with step along `d` (end clamped to the size).
  Tensor slice(int64_t d, int64_t start, int64_t end, int64_t step = 1) const;
  /// Broadcasts size-1 dimensions (and prepends new ones) to `shape`, with zero strides.
  Tensor expand(const Shape& shape) const;
  /// Reinterprets a contiguous tensor with a new shape of the same numel.
  Tensor view(const Shape& shape) const;

  // Copies.
  /// Returns this tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const;
  /// Contiguous copy converted to `dtype` (rounding to nearest even for half types).
  Tensor to(DType dtype) const;
  Tensor clone() const;
  /// Copies `src` (broadcast to this shape, converted to this dtype) into this tensor.
  void copy_(const Tensor& src);

  /// Element at a multi-index, converted to double (for tests and tools, not kernels).
  double item(std::span<const int64_t> index) const;
  double item(std::initializer_list<int64_t> index) const {
    return item(std::span<const int64_t>(index.begin(), index.size()));
  }
  /// Writes one element (converted from double).
  void set_item(std::span<const int64_t> index, double value);
  /// "[2, 16, 7, 64] float32 cpu".
  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape sizes_;
  Shape strides_;
  DType dtype_ = DType::kFloat32;
  Device device_{};
};

/// Row-major strides for `shape`.
Shape contiguous_strides(const Shape& shape);
/// Number of elements; throws sdpa::Error when it overflows int64.
int64_t checked_numel(const Shape& shape);
/// "[2, 16, 7, 64]".
std::string shape_str(const Shape& shape);

}  // namespace sdpa
