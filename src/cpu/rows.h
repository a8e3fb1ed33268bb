#pragma once
// Strided row access to [B, H, N, D] tensors in any floating dtype, converting to and from
// the compute type. The dtype switch sits outside the element loop.

#include <immintrin.h>

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/targets.h"
#include "sdpa/tensor.h"

namespace sdpa::cpu {

inline float widen(float x) { return x; }
inline double widen(double x) { return x; }
inline float widen(bfloat16 x) { return static_cast<float>(x); }
inline float widen(float16 x) { return static_cast<float>(x); }

/// float8_e4m3fn's 256 values, indexed by its bits: the scalar conversion of the row loads.
inline const std::array<float, 256> kE4M3FNValues = [] {
  std::array<float, 256> values{};
  for (int bits = 0; bits < 256; ++bits) {
    float8_e4m3fn x;
    x.bits = static_cast<uint8_t>(bits);
    values[static_cast<size_t>(bits)] = static_cast<float>(x);
  }
  return values;
}();
inline float widen(float8_e4m3fn x) { return kE4M3FNValues[x.bits]; }

/// Converts a compute value to storage type S (round to nearest even for half types).
template <typename S, typename T>
S narrow(T x) {
  if constexpr (std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>) {
    return S(static_cast<float>(x));
  } else {
    return static_cast<S>(x);
  }
}

/// Whether this CPU has the F16C half <-> float conversions and the OS saves the ymm
/// registers they write: Highway's AVX2 target requires both (clang 14's
/// __builtin_cpu_supports knows no "f16c").
inline bool has_f16c() {
  static const bool available = (hwy::SupportedTargets() & HWY_AVX2) != 0;
  return available;
}

/// dst[c] = float(src[c]) * multiplier for c < n, through F16C (has_f16c()). Finite and
/// infinite values convert exactly as float16's portable conversion; NaNs stay NaN.
__attribute__((target("avx,f16c"))) inline void HalfRowToFloat(const uint16_t* src, int64_t n,
                                                              float multiplier, float* dst) {
  const __m256 m = _mm256_set1_ps(multiplier);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
    _mm256_storeu_ps(dst + c, _mm256_mul_ps(_mm256_cvtph_ps(h), m));
  }
  for (; c < n; ++c) dst[c] = _cvtsh_ss(src[c]) * multiplier;
}

/// dst[c] = float16(src[c]) for c < n through F16C (has_f16c()): round to nearest even,
/// as float16's portable conversion.
__attribute__((target("avx,f16c"))) inline void FloatRowToHalf(const float* src, int64_t n,
                                                              uint16_t* dst) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + c),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; c < n; ++c) dst[c] = _cvtss_sh(src[c], _MM_FROUND_TO_NEAREST_INT);
}

/// Where the rows of a paged view live (KvPages): row r is row r % page_size of page
/// table[r / page_size], pages page_stride elements apart.
struct PagedRows {
  const int32_t* table = nullptr;  ///< the batch's block_table row
  int64_t page_size = 1;
  int64_t page_stride = 0;
};

/// Rows of one (batch, head) slice of a 4-D tensor (or of a paged view: PagedRows).
class RowView {
 public:
  /// Rows of a paged view: t's strides address rows within a page, `pages` the pages.
  RowView(const Tensor& t, int64_t b, int64_t h, const PagedRows& pages) : RowView(t, b, h) {
    pages_ = pages.table;
    page_size_ = pages.page_size;
    page_stride_ = pages.page_stride;
    page_shift_ = (page_size_ & (page_size_ - 1)) == 0 ? std::countr_zero(
                                                             static_cast<uint64_t>(page_size_))
                                                       : -1;
  }

  /// Rows [first, first + n) of a staging buffer of dtype elements: row r at `base` +
  /// (r - first) * row_stride elements, `cols` of unit stride (the decode path's copy of a
  /// key tile, flash_decode.h). Readers need not request such rows ahead (is_window()).
  static RowView window(const void* base, DType dtype, int64_t first, int64_t row_stride,
                        int64_t cols, float dequant_scale) {
    RowView view;
    view.element_bytes_ = static_cast<int64_t>(element_size(dtype));
    view.base_ = static_cast<char*>(const_cast<void*>(base));
    view.dtype_ = dtype;
    view.stride_row_ = row_stride;
    view.stride_col_ = 1;
    view.cols_ = cols;
    view.f16c_ = dtype == DType::kFloat16 && has_f16c();
    view.dequant_scale_ = dequant_scale;
    view.first_row_ = first;
    view.window_ = true;
    return view;
  }

  RowView(const Tensor& t, int64_t b, int64_t h)
      : element_bytes_(static_cast<int64_t>(element_size(t.dtype()))),
        // An empty tensor (E = 0 included) has no address to offset: loads and stores
        // of its rows do nothing.
        base_(t.data_ptr() == nullptr
                  ? nullptr
                  : static_cast<char*>(t.data_ptr()) +
                        (b * t.stride(0) + h * t.stride(1)) * element_bytes_),
        dtype_(t.dtype()),
        stride_row_(t.stride(2)),
        stride_col_(t.stride(3)),
        cols_(t.size(3)),
        // The portable conversion costs about as much per element as a q.k^T column.
        f16c_(dtype_ == DType::kFloat16 && stride_col_ == 1 && has_f16c()) {}

  int64_t cols() const { return cols_; }
  DType dtype() const { return dtype_; }
  int64_t col_stride() const { return stride_col_; }
  int64_t row_stride() const { return stride_row_; }
  int64_t element_bytes() const { return element_bytes_; }
  /// Whether this is a staging buffer's window (RowView::window): rows already in cache.
  bool is_window() const { return window_; }
  /// Address of row r's first element (stored dtype).
  const void* row_data(int64_t r) const { return row_address(r); }
  /// How many rows from r on lie row_stride() apart from row_data(r): all of them, or the
  /// rest of r's page for a paged view.
  int64_t rows_in_run(int64_t r) const {
    return pages_ == nullptr ? std::numeric_limits<int64_t>::max() : page_size_ - r % page_size_;
  }

  /// Multiplies every element load() reads (a float8_e4m3fn cache's per-head scale).
  void set_dequant_scale(float scale) { dequant_scale_ = scale; }
  float dequant_scale() const { return dequant_scale_; }

  /// dst[c] = row[r][c] * dequant_scale() * multiplier for c < cols().
  template <typename T>
  void load(int64_t r, T* dst, T multiplier = T(1)) const {
    if (base_ == nullptr) return;
    if constexpr (std::is_same_v<T, float>) {
      if (f16c_) return HalfRowToFloat(half_row(r), cols_, multiplier, dst);
    }
    switch (dtype_) {
      case DType::kFloat32: return load_as<float>(r, dst, multiplier);
      case DType::kFloat64: return load_as<double>(r, dst, multiplier);
      case DType::kBFloat16: return load_as<bfloat16>(r, dst, multiplier);
      case DType::kFloat16: return load_as<float16>(r, dst, multiplier);
      case DType::kFloat8E4M3FN:
        return load_as<float8_e4m3fn>(r, dst, multiplier * static_cast<T>(dequant_scale_));
      default: return;
    }
  }

  /// row[r][c] = src[c] (rounded to the tensor dtype) for c < cols().
  template <typename T>
  void store(int64_t r, const T* src) const {
    if (base_ == nullptr) return;
    if constexpr (std::is_same_v<T, float>) {
      if (f16c_) return FloatRowToHalf(src, cols_, half_row(r));
    }
    switch (dtype_) {
      case DType::kFloat32: return store_as<float>(r, src);
      case DType::kFloat64: return store_as<double>(r, src);
      case DType::kBFloat16: return store_as<bfloat16>(r, src);
      case DType::kFloat16: return store_as<float16>(r, src);
      default: return;
    }
  }

 private:
  RowView() = default;
  char* row_address(int64_t r) const {
    if (pages_ == nullptr) return base_ + (r - first_row_) * stride_row_ * element_bytes_;
    const int64_t page = page_shift_ >= 0 ? r >> page_shift_ : r / page_size_;
    const int64_t within = r - page * page_size_;
    return base_ + (pages_[page] * page_stride_ + within * stride_row_) * element_bytes_;
  }
  uint16_t* half_row(int64_t r) const { return reinterpret_cast<uint16_t*>(row_address(r)); }
  template <typename S, typename T>
  void load_as(int64_t r, T* dst, T multiplier) const {
    const S* row = reinterpret_cast<const S*>(row_address(r));
    for (int64_t c = 0; c < cols_; ++c) {
      dst[c] = static_cast<T>(widen(row[c * stride_col_])) * multiplier;
    }
  }
  template <typename S, typename T>
  void store_as(int64_t r, const T* src) const {
    S* row = reinterpret_cast<S*>(row_address(r));
    for (int64_t c = 0; c < cols_; ++c) row[c * stride_col_] = narrow<S>(src[c]);
  }

  int64_t element_bytes_ = 0;  // cached: row_data() runs once per key row in the decode path
  char* base_ = nullptr;
  DType dtype_ = DType::kFloat32;
  int64_t stride_row_ = 0;
  int64_t stride_col_ = 1;
  int64_t cols_ = 0;
  bool f16c_ = false;  // float16 with unit column stride on an F16C CPU
  float dequant_scale_ = 1.0f;
  // Paged views (PagedRows): the table, null otherwise.
  const int32_t* pages_ = nullptr;
  int64_t page_size_ = 1;
  int64_t page_stride_ = 0;
  int page_shift_ = -1;  // log2(page_size_) when a power of two
  // A window's first row (RowView::window); 0 otherwise.
  int64_t first_row_ = 0;
  bool window_ = false;
};

}  // namespace sdpa::cpu
