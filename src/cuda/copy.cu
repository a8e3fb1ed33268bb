// Copies of CUDA tensors: host <-> device transfers (cudaMemcpyAsync) and strided gathers
// on the device that make a view contiguous.

#include <cuda_runtime.h>

#include "cuda/copy.h"
#include "cuda/math.h"
#include "cuda/status.h"
#include "sdpa/cuda.h"

namespace sdpa::cuda {
namespace {

constexpr int kMaxDims = 8;

// A view's sizes and element strides, passed by value to the gather kernel.
struct Layout {
  int dims;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
};

// dst[n] = src[offset of the n-th element in row-major order]. Element types are moved as
// same-sized integers: the copy never converts.
template <typename Word>
__global__ void gather(Word* dst, const Word* src, Layout layout, int64_t numel) {
  for (int64_t n = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; n < numel;
       n += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = n, offset = 0;
    for (int d = layout.dims - 1; d >= 0; --d) {
      offset += rest % layout.sizes[d] * layout.strides[d];
      rest /= layout.sizes[d];
    }
    dst[n] = src[offset];
  }
}

// Gathers device tensor `src` into contiguous device tensor `dst` (same shape and dtype).
void gather_contiguous(const Tensor& dst, const Tensor& src, cudaStream_t stream) {
  const int64_t numel = src.numel();
  if (numel == 0) return;
  SDPA_CHECK(src.dim() <= kMaxDims, "to_device: expected at most ", kMaxDims,
             " dimensions, got ", src.describe());
  Layout layout{static_cast<int>(src.dim()), {}, {}};
  for (int d = 0; d < layout.dims; ++d) {
    layout.sizes[d] = src.size(d);
    layout.strides[d] = src.stride(d);
  }
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((numel + threads - 1) / threads, 65536);
  const int grid = static_cast<int>(blocks);
  switch (element_size(src.dtype())) {
    case 1:
      gather<<<grid, threads, 0, stream>>>(dst.data<uint8_t>(), src.data<uint8_t>(), layout,
                                           numel);
      break;
    case 2:
      gather<<<grid, threads, 0, stream>>>(dst.data<uint16_t>(), src.data<uint16_t>(), layout,
                                           numel);
      break;
    case 4:
      gather<<<grid, threads, 0, stream>>>(dst.data<uint32_t>(), src.data<uint32_t>(), layout,
                                           numel);
      break;
    default:
      gather<<<grid, threads, 0, stream>>>(dst.data<uint64_t>(), src.data<uint64_t>(), layout,
                                           numel);
      break;
  }
  detail::check_launch("to_device (gather kernel)");
}

}  // namespace

Tensor to_device(const Tensor& src, Device device, Stream stream_handle) {
  SDPA_CHECK(src.defined(), "to_device: expected a defined tensor, got an undefined one");
  SDPA_CHECK(device.type == DeviceType::kCPU || device.type == DeviceType::kCUDA,
             "to_device: expected a cpu or cuda device, got ", device_name(device));
  SDPA_CHECK(src.device().type == DeviceType::kCPU || src.device().type == DeviceType::kCUDA,
             "to_device: expected a cpu or cuda tensor, got ", src.describe());
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  if (src.device() == device && src.is_contiguous()) return src;
  const size_t nbytes = static_cast<size_t>(src.numel()) * element_size(src.dtype());

  if (src.device().type == DeviceType::kCPU) {  // host -> device
    const Tensor host = src.contiguous();
    Tensor dst = empty(src.sizes(), src.dtype(), device.index, stream_handle);
    if (nbytes == 0) return dst;
    detail::DeviceGuard guard(device.index);
    detail::check(cudaMemcpyAsync(dst.data_ptr(), host.data_ptr(), nbytes,
                                  cudaMemcpyHostToDevice, stream),
                  "cudaMemcpyAsync (host to device)");
    // The pageable host buffer may be freed when this returns: wait for the transfer.
    detail::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return dst;
  }

  detail::DeviceGuard guard(src.device().index);
  Tensor packed = src;
  if (!src.is_contiguous()) {
    packed = empty(src.sizes(), src.dtype(), src.device().index, stream_handle);
    gather_contiguous(packed, src, stream);
  }
  if (device.type == DeviceType::kCUDA) {
    if (device == src.device()) return packed;
    // `stream` belongs to the source device: the destination's memory comes from its own
    // default stream, and the copy finishes before either is used elsewhere.
    Tensor dst = empty(src.sizes(), src.dtype(), device.index, nullptr);
    if (nbytes > 0) {
      detail::check(cudaMemcpyPeerAsync(dst.data_ptr(), device.index, packed.data_ptr(),
                                        src.device().index, nbytes, stream),
                    "cudaMemcpyPeerAsync");
    }
    detail::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return dst;
  }
  Tensor dst = Tensor::empty(src.sizes(), src.dtype());
  if (nbytes > 0) {
    detail::check(cudaMemcpyAsync(dst.data_ptr(), packed.data_ptr(), nbytes,
                                  cudaMemcpyDeviceToHost, stream),
                  "cudaMemcpyAsync (device to host)");
  }
  detail::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return dst;
}

namespace detail {

Tensor copy_with_aligned_rows(const Tensor& t, size_t align_bytes, void* stream_handle) {
  SDPA_CHECK(t.dim() == 4, "copy_with_aligned_rows: expected a 4-D tensor, got ", t.describe());
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const Tensor packed = to_device(t, t.device(), stream_handle);
  const size_t esize = element_size(t.dtype());
  const int64_t cols = t.size(3);
  const int64_t align = static_cast<int64_t>(align_bytes / esize);
  const int64_t pitch = (cols + align - 1) / align * align;
  const int64_t rows = t.size(0) * t.size(1) * t.size(2);
  Tensor storage = empty({rows * pitch}, t.dtype(), t.device().index, stream_handle);
  if (rows * cols > 0) {
    DeviceGuard guard(t.device().index);
    check(cudaMemcpy2DAsync(storage.data_ptr(), pitch * esize, packed.data_ptr(), cols * esize,
                            cols * esize, rows, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpy2DAsync");
  }
  const Shape strides{t.size(1) * t.size(2) * pitch, t.size(2) * pitch, pitch, 1};
  return Tensor::from_blob(storage.data_ptr(), t.sizes(), strides, t.dtype(), t.device(),
                           storage.storage());
}

}  // namespace detail

void fill_zeros(const Tensor& t, void* stream) {
  if (t.numel() == 0) return;
  detail::DeviceGuard guard(t.device().index);
  detail::check(cudaMemsetAsync(t.data_ptr(), 0,
                                static_cast<size_t>(t.numel()) * element_size(t.dtype()),
                                static_cast<cudaStream_t>(stream)),
                "cudaMemsetAsync");
}

}  // namespace sdpa::cuda
