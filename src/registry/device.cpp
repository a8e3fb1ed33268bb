// Tensors on external devices: allocation through the device's interface, and copies
// between host and device (strided, through a host staging buffer when needed).

#include <cstring>

#include "registry/registry_impl.h"
#include "sdpa/cuda.h"

namespace sdpa {
namespace {

// Element offsets [lo, hi] a tensor touches relative to data_ptr (hi < lo when empty).
std::pair<int64_t, int64_t> element_extent(const Tensor& t) {
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 0) return {0, -1};
    const int64_t step = (t.size(d) - 1) * t.stride(d);
    (step < 0 ? lo : hi) += step;
  }
  return {lo, hi};
}

std::shared_ptr<const DeviceInterface> interface_of(Device device, const char* what) {
  auto iface = registry::device_interface(device);
  SDPA_CHECK(iface != nullptr, what, ": no device interface is registered for ",
             device_name(device), " (register_device or load_backend first)");
  return iface;
}

// Copies the memory `t` spans on its external device into a host buffer and returns a
// host tensor with t's sizes and strides viewing that buffer.
Tensor stage_to_host(const Tensor& t, const DeviceInterface& iface) {
  const auto [lo, hi] = element_extent(t);
  const size_t esize = element_size(t.dtype());
  if (hi < lo) return Tensor::empty(t.sizes(), t.dtype());
  Tensor buffer = Tensor::empty({hi - lo + 1}, t.dtype());
  iface.copy_to_host(buffer.data_ptr(), static_cast<const char*>(t.data_ptr()) + lo * esize,
                     static_cast<size_t>(hi - lo + 1) * esize);
  return Tensor::from_blob(static_cast<char*>(buffer.data_ptr()) - lo * esize, t.sizes(),
                           t.strides(), t.dtype(), Device{}, buffer.storage());
}

// Writes host tensor `src` (dst's shape) into external tensor `dst`.
void write_from_host(const Tensor& dst, const Tensor& src, const DeviceInterface& iface) {
  const size_t esize = element_size(dst.dtype());
  if (dst.numel() == 0) return;
  if (dst.is_contiguous() && src.is_contiguous() && src.dtype() == dst.dtype() &&
      src.sizes() == dst.sizes()) {
    iface.copy_from_host(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(dst.numel()) * esize);
    return;
  }
  // Other strides: read the span dst covers, update it on the host, write it back.
  const auto [lo, hi] = element_extent(dst);
  Tensor staged = stage_to_host(dst, iface);
  staged.copy_(src);
  iface.copy_from_host(static_cast<char*>(dst.data_ptr()) + lo * esize,
                       static_cast<const char*>(staged.data_ptr()) + lo * esize,
                       static_cast<size_t>(hi - lo + 1) * esize);
}

}  // namespace

Tensor empty(const Shape& shape, DType dtype, Device device) {
  if (device.type == DeviceType::kCPU) return Tensor::empty(shape, dtype);
  if (device.type == DeviceType::kCUDA) return cuda::empty(shape, dtype, device.index);
  auto iface = interface_of(device, "empty");
  const size_t nbytes = static_cast<size_t>(checked_numel(shape)) * element_size(dtype);
  void* data = nullptr;
  if (nbytes > 0) {
    data = iface->allocate(nbytes);
    SDPA_CHECK(data != nullptr, "empty: ", iface->name, " (", device_name(device),
               ") is out of memory allocating ", nbytes, " bytes");
  }
  std::shared_ptr<void> owner(data, [iface](void* p) {
    if (p != nullptr) iface->free(p);
  });
  return Tensor::from_blob(data, shape, contiguous_strides(shape), dtype, device,
                           std::move(owner));
}

Tensor to_host(const Tensor& t) { return to_device(t, Device{}); }

Tensor to_device(const Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return t;
  if (device.type == DeviceType::kCUDA || t.device().type == DeviceType::kCUDA) {
    return cuda::to_device(t, device);
  }
  if (device.type == DeviceType::kCPU) {
    Tensor staged = stage_to_host(t, *interface_of(t.device(), "to_host"));
    return staged.contiguous();
  }
  Tensor result = empty(t.sizes(), t.dtype(), device);
  copy(result, t);
  return result;
}

void copy(const Tensor& dst, const Tensor& src_in) {
  SDPA_CHECK(dst.defined() && src_in.defined(), "copy: expected defined tensors, got ",
             dst.describe(), " <- ", src_in.describe());
  const Tensor src = src_in.expand(dst.sizes());
  const Device to = dst.device(), from = src.device();
  Tensor dst_handle = dst;  // a handle: copy_ writes dst's memory
  if (to.type == DeviceType::kCPU && from.type == DeviceType::kCPU) {
    dst_handle.copy_(src);
    return;
  }
  if (to.type == DeviceType::kCPU) {
    dst_handle.copy_(stage_to_host(src, *interface_of(from, "copy")));
    return;
  }
  auto dst_iface = interface_of(to, "copy");
  if (from.type == DeviceType::kCPU) {
    write_from_host(dst, src, *dst_iface);
    return;
  }
  if (to == from && dst_iface->copy_on_device && dst.is_contiguous() && src.is_contiguous() &&
      dst.dtype() == src.dtype() && src.sizes() == dst.sizes() &&
      registry::overlaps(dst, src) == false) {
    if (dst.numel() > 0) {
      dst_iface->copy_on_device(dst.data_ptr(), src.data_ptr(),
                                static_cast<size_t>(dst.numel()) * element_size(dst.dtype()));
    }
    return;
  }
  write_from_host(dst, stage_to_host(src, *interface_of(from, "copy")), *dst_iface);
}

namespace registry {

AttentionParams params_to_host(const AttentionParams& params) {
  AttentionParams p = params;
  // Strided host views of the device memory (kernels take any strides; a broadcast mask
  // stays broadcast instead of being expanded).
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.grad_out, &p.out, &p.lse, &p.mask.dense}) {
    if (t->defined() && t->device().type != DeviceType::kCPU) {
      *t = stage_to_host(*t, *interface_of(t->device(), "to_host"));
    }
  }
  p.device = Device{};
  return p;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.device() != b.device()) return false;
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto [a_lo, a_hi] = element_extent(a);
  const auto [b_lo, b_hi] = element_extent(b);
  const char* a_base = static_cast<const char*>(a.data_ptr());
  const char* b_base = static_cast<const char*>(b.data_ptr());
  const int64_t a_es = static_cast<int64_t>(element_size(a.dtype()));
  const int64_t b_es = static_cast<int64_t>(element_size(b.dtype()));
  const char* a_begin = a_base + a_lo * a_es;
  const char* a_end = a_base + (a_hi + 1) * a_es;
  const char* b_begin = b_base + b_lo * b_es;
  const char* b_end = b_base + (b_hi + 1) * b_es;
  return a_begin < b_end && b_begin < a_end;
}

}  // namespace registry
}  // namespace sdpa
