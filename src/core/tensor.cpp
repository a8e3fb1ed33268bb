#include "sdpa/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/element_access.h"
#include "sdpa/error.h"

namespace sdpa {

namespace detail {
void throw_too_many_dims(size_t dims) {
  throw_error("tensor: expected at most ", Shape::kMaxDims, " dimensions, got ", dims);
}
}  // namespace detail

namespace {

int64_t wrap_dim(int64_t d, int64_t ndim, const char* what) {
  const int64_t wrapped = d < 0 ? d + ndim : d;
  SDPA_CHECK(wrapped >= 0 && wrapped < ndim, what, ": dimension ", d, " out of range for a ",
             ndim, "-D tensor");
  return wrapped;
}

// Checks that every element offset of (shape, strides), and its offset in bytes for
// `dtype`, fits in int64 (kernels address elements through byte pointers) and returns
// the span [min_offset, max_offset] in elements.
std::pair<int64_t, int64_t> checked_extent(const Shape& shape, const Shape& strides, DType dtype) {
  int64_t lo = 0, hi = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return {0, -1};
    int64_t step;
    SDPA_CHECK(!__builtin_mul_overflow(shape[i] - 1, strides[i], &step),
               "tensor: element offsets overflow int64 (size ", shape[i], " x stride ",
               strides[i], ")");
    int64_t& bound = step < 0 ? lo : hi;
    SDPA_CHECK(!__builtin_add_overflow(bound, step, &bound),
               "tensor: element offsets overflow int64 for shape ", shape_str(shape));
  }
  const auto bytes = static_cast<int64_t>(element_size(dtype));
  int64_t unused;
  SDPA_CHECK(!__builtin_mul_overflow(lo, bytes, &unused) && !__builtin_mul_overflow(hi, bytes, &unused),
             "tensor: byte offsets of shape ", shape_str(shape), " with strides ",
             shape_str(strides), " overflow int64 for ", dtype_name(dtype));
  return {lo, hi};
}

}  // namespace

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // A zero-size tensor may have dimensions whose product overflows; its strides are
    // never used to address anything, so they saturate instead of overflowing.
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s)) {
      s = std::numeric_limits<int64_t>::max();
    }
  }
  return strides;
}

int64_t checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    SDPA_CHECK(s >= 0, "tensor: sizes must be non-negative, got ", shape_str(shape));
    SDPA_CHECK(!__builtin_mul_overflow(n, s, &n), "tensor: number of elements of ",
               shape_str(shape), " overflows int64");
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  const int64_t n = checked_numel(shape);
  size_t nbytes;
  SDPA_CHECK(!__builtin_mul_overflow(static_cast<size_t>(n), element_size(dtype), &nbytes),
             "tensor: byte size of ", shape_str(shape), " overflows");
  Tensor t;
  t.storage_ = Storage::allocate(nbytes);
  t.sizes_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.storage_->nbytes() > 0) std::memset(t.data_ptr(), 0, t.storage_->nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) detail::store_element(t.data_ptr(), dtype, i, value);
  return t;
}

Tensor Tensor::from_blob(void* data, Shape shape, Shape strides, DType dtype, Device device,
                         std::shared_ptr<void> owner) {
  SDPA_CHECK(shape.size() == strides.size(), "from_blob: shape ", shape_str(shape), " and strides ",
             shape_str(strides), " have different ranks");
  checked_numel(shape);
  checked_extent(shape, strides, dtype);
  Tensor t;
  // Without an owner, no release function: std::function would heap-allocate even a
  // capture of an empty shared_ptr, once per imported tensor. (An owner may hold a null
  // pointer with a deleter: what counts is its control block.)
  std::function<void()> release;
  if (owner.use_count() > 0) release = [owner = std::move(owner)] {};
  t.storage_ = Storage::wrap(data, 0, device, std::move(release));
  t.sizes_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

int64_t Tensor::size(int64_t d) const { return sizes_[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides_[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return checked_numel(sizes_); }

void* Tensor::data_ptr() const {
  // An empty storage has no address: views into it (offset > 0 after a slice of an
  // empty tensor) have none either, and offsetting null would be undefined.
  if (!storage_ || storage_->data() == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size(dtype_));
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = sizes_.size(); i-- > 0;) {
    if (sizes_[i] == 1) continue;
    if (sizes_[i] == 0) return true;
    if (strides_[i] != expected) return false;
    expected *= sizes_[i];
  }
  return true;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Tensor t = *this;
  d0 = wrap_dim(d0, dim(), "transpose");
  d1 = wrap_dim(d1, dim(), "transpose");
  std::swap(t.sizes_[d0], t.sizes_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  SDPA_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: expected ", dim(),
             " dimensions, got ", dims.size());
  Tensor t = *this;
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    SDPA_CHECK(!seen[d], "permute: dimension ", d, " repeated");
    seen[d] = true;
    t.sizes_[i] = sizes_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Tensor t = *this;
  const int64_t stride = d < dim() ? sizes_[d] * strides_[d] : 1;
  t.sizes_.insert(t.sizes_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, stride);
  return t;
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  SDPA_CHECK(sizes_[d] == 1, "squeeze: dimension ", d, " has size ", sizes_[d], ", expected 1");
  Tensor t = *this;
  t.sizes_.erase(t.sizes_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  const int64_t i = index < 0 ? index + sizes_[d] : index;
  SDPA_CHECK(i >= 0 && i < sizes_[d], "select: index ", index, " out of range for size ",
             sizes_[d]);
  Tensor t = *this;
  t.offset_ += i * strides_[d];
  t.sizes_.erase(t.sizes_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  SDPA_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = sizes_[d];
  start = std::clamp<int64_t>(start < 0 ? start + n : start, 0, n);
  end = std::clamp<int64_t>(end < 0 ? end + n : end, start, n);
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.sizes_[d] = (end - start + step - 1) / step;
  t.strides_[d] = strides_[d] * step;
  return t;
}

Tensor Tensor::expand(const Shape& shape) const {
  SDPA_CHECK(shape.size() >= sizes_.size(), "expand: cannot expand ", shape_str(sizes_), " to ",
             shape_str(shape));
  Tensor t = *this;
  const size_t lead = shape.size() - sizes_.size();
  t.sizes_ = shape;
  t.strides_.assign(shape.size(), 0);
  for (size_t i = 0; i < sizes_.size(); ++i) {
    const int64_t have = sizes_[i], want = shape[lead + i];
    SDPA_CHECK(have == want || have == 1, "expand: cannot expand ", shape_str(sizes_), " to ",
               shape_str(shape));
    t.strides_[lead + i] = have == want ? strides_[i] : 0;
  }
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  SDPA_CHECK(is_contiguous(), "view: tensor ", describe(), " is not contiguous");
  SDPA_CHECK(checked_numel(shape) == numel(), "view: shape ", shape_str(shape),
             " does not match ", numel(), " elements");
  Tensor t = *this;
  t.sizes_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const { return to(dtype_); }

Tensor Tensor::to(DType dtype) const {
  SDPA_CHECK(device_.type == DeviceType::kCPU, "to: only CPU tensors can be copied, got ",
             device_name(device_));
  Tensor t = empty(sizes_, dtype);
  t.copy_(*this);
  return t;
}

namespace {

// Copies `n` elements of `bytes` bytes each, `src_stride` / `dst_stride` elements apart.
void copy_run(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t n,
              size_t bytes) {
  if (src_stride == 1 && dst_stride == 1) {
    std::memmove(dst, src, static_cast<size_t>(n) * bytes);
    return;
  }
  const int64_t step_src = src_stride * static_cast<int64_t>(bytes);
  const int64_t step_dst = dst_stride * static_cast<int64_t>(bytes);
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * step_dst, src + i * step_src, bytes);
}

}  // namespace

void Tensor::copy_(const Tensor& src) {
  SDPA_CHECK(device_.type == DeviceType::kCPU && src.device_.type == DeviceType::kCPU,
             "copy_: only CPU tensors can be copied");
  const Tensor from = src.expand(sizes_);
  const int64_t n = numel();
  if (n == 0) return;
  // Runs along the last dimension: one offset computation per run, and a plain copy of
  // the run's bytes when the dtypes agree (converting copies go element by element).
  const int64_t ndim = dim();
  const int64_t run = ndim == 0 ? 1 : sizes_[ndim - 1];
  const int64_t src_step = ndim == 0 ? 0 : from.strides_[ndim - 1];
  const int64_t dst_step = ndim == 0 ? 0 : strides_[ndim - 1];
  const size_t bytes = element_size(dtype_);
  const char* src_data = static_cast<const char*>(from.data_ptr());
  char* dst_data = static_cast<char*>(data_ptr());
  Shape index(static_cast<size_t>(std::max<int64_t>(ndim - 1, 0)), 0);
  for (int64_t done = 0; done < n; done += run) {
    int64_t src_off = 0, dst_off = 0;
    for (int64_t d = 0; d + 1 < ndim; ++d) {
      src_off += index[d] * from.strides_[d];
      dst_off += index[d] * strides_[d];
    }
    if (from.dtype_ == dtype_) {
      copy_run(src_data + src_off * static_cast<int64_t>(bytes), src_step,
               dst_data + dst_off * static_cast<int64_t>(bytes), dst_step, run, bytes);
    } else {
      for (int64_t i = 0; i < run; ++i) {
        detail::store_element(dst_data, dtype_, dst_off + i * dst_step,
                              detail::load_element(src_data, from.dtype_, src_off + i * src_step));
      }
    }
    for (int64_t d = ndim - 2; d >= 0; --d) {
      if (++index[d] < sizes_[d]) break;
      index[d] = 0;
    }
  }
}

namespace {
int64_t offset_of(const Tensor& t, std::span<const int64_t> index) {
  SDPA_CHECK(static_cast<int64_t>(index.size()) == t.dim(), "item: expected ", t.dim(),
             " indices, got ", index.size());
  int64_t off = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    SDPA_CHECK(index[d] >= 0 && index[d] < t.size(d), "item: index ", index[d],
               " out of range for dimension ", d, " of size ", t.size(d));
    off += index[d] * t.stride(d);
  }
  return off;
}
}  // namespace

double Tensor::item(std::span<const int64_t> index) const {
  return detail::load_element(data_ptr(), dtype_, offset_of(*this, index));
}

void Tensor::set_item(std::span<const int64_t> index, double value) {
  detail::store_element(data_ptr(), dtype_, offset_of(*this, index), value);
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  std::ostringstream os;
  os << shape_str(sizes_) << ' ' << dtype_name(dtype_) << ' ' << device_name(device_);
  return os.str();
}

}  // namespace sdpa
