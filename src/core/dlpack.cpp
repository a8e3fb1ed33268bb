#include "sdpa/dlpack.h"

#include <dlpack/dlpack.h>

#include <memory>
#include <string>

#include "sdpa/error.h"

namespace sdpa {
namespace {

// DLPack 0.8 added kDLBool; older headers (Debian's 0.6) lack it, so name it here.
constexpr uint8_t kDLBoolCode = 6;
// DLPack 1.1's kDLFloat8_e4m3fn (torch.float8_e4m3fn's code), likewise.
constexpr uint8_t kDLFloat8E4M3FNCode = 10;

// "uint8", "complex64", ...: DLPack's type as numpy and torch name it.
std::string dl_type_name(DLDataType t) {
  const int bits = t.bits;
  switch (t.code) {
    case kDLInt: return "int" + std::to_string(bits);
    case kDLUInt: return "uint" + std::to_string(bits);
    case kDLFloat: return "float" + std::to_string(bits);
    case kDLBfloat: return "bfloat" + std::to_string(bits);
    case kDLBoolCode: return "bool (" + std::to_string(bits) + " bits)";
    case kDLFloat8E4M3FNCode: return "float8_e4m3fn (" + std::to_string(bits) + " bits)";
    case kDLComplex: return "complex" + std::to_string(bits);
    default: return "DLPack type code " + std::to_string(int(t.code)) + " with " +
                    std::to_string(bits) + " bits";
  }
}

DType dtype_from_dl(DLDataType t) {
  SDPA_CHECK(t.lanes == 1, "from_dlpack: vector dtypes (lanes=", int(t.lanes),
             ") are not supported");
  if (t.code == kDLFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return DType::kFloat64;
  if (t.code == kDLFloat && t.bits == 16) return DType::kFloat16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBFloat16;
  if (t.code == kDLBoolCode && t.bits == 8) return DType::kBool;
  if (t.code == kDLInt && t.bits == 32) return DType::kInt32;
  if (t.code == kDLInt && t.bits == 64) return DType::kInt64;
  if (t.code == kDLFloat8E4M3FNCode && t.bits == 8) return DType::kFloat8E4M3FN;
  detail::throw_error("from_dlpack: expected a float16/32/64, bfloat16, bool, int32, int64 or "
                      "float8_e4m3fn tensor, got ", dl_type_name(t));
}

DLDataType dtype_to_dl(DType d) {
  switch (d) {
    case DType::kFloat32: return {kDLFloat, 32, 1};
    case DType::kFloat64: return {kDLFloat, 64, 1};
    case DType::kFloat16: return {kDLFloat, 16, 1};
    case DType::kBFloat16: return {kDLBfloat, 16, 1};
    case DType::kBool: return {kDLBoolCode, 8, 1};
    case DType::kInt32: return {kDLInt, 32, 1};
    case DType::kInt64: return {kDLInt, 64, 1};
    case DType::kFloat8E4M3FN: return {kDLFloat8E4M3FNCode, 8, 1};
  }
  return {kDLFloat, 32, 1};
}

Device device_from_dl(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return {DeviceType::kCPU, d.device_id};
    case kDLCUDA: return {DeviceType::kCUDA, d.device_id};
    case kDLExtDev: return {DeviceType::kExternal, d.device_id};
    default:
      detail::throw_error("from_dlpack: expected a CPU, CUDA or external-device tensor, got "
                          "DLPack device type ", int(d.device_type));
  }
}

// Keeps the exported Tensor (and so its storage) alive with the DLManagedTensor. The
// DLTensor's shape and strides point into the tensor's own arrays (consumers only read
// them): one allocation per export, which a tiny call's output pays on every call.
struct ExportContext {
  Tensor tensor;
  DLManagedTensor managed{};
};

}  // namespace

Tensor from_dlpack(DLManagedTensor* managed) {
  SDPA_CHECK(managed != nullptr, "from_dlpack: got a null DLManagedTensor");
  // Owns `managed` from here on, even if validation below throws.
  std::shared_ptr<DLManagedTensor> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  return view_dlpack(*managed, std::move(owner));
}

Tensor view_dlpack(const DLManagedTensor& managed, std::shared_ptr<void> owner) {
  const DLTensor& t = managed.dl_tensor;
  const DType dtype = dtype_from_dl(t.dtype);
  const Device device = device_from_dl(t.device);
  SDPA_CHECK(t.ndim >= 0, "from_dlpack: negative ndim ", t.ndim);
  Shape shape(t.shape, t.shape + t.ndim);
  Shape strides = t.strides ? Shape(t.strides, t.strides + t.ndim) : contiguous_strides(shape);
  SDPA_CHECK(t.byte_offset % element_size(dtype) == 0, "from_dlpack: byte_offset ",
             t.byte_offset, " is not a multiple of the element size");
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  return Tensor::from_blob(data, std::move(shape), std::move(strides), dtype, device,
                           std::move(owner));
}

DLManagedTensor* to_dlpack(const Tensor& tensor) {
  SDPA_CHECK(tensor.defined(), "to_dlpack: tensor is undefined");
  auto* ctx = new ExportContext{tensor, {}};
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = tensor.data_ptr();
  t.device = {static_cast<DLDeviceType>(tensor.device().type), tensor.device().index};
  t.ndim = static_cast<int32_t>(tensor.dim());
  t.dtype = dtype_to_dl(tensor.dtype());
  // DLTensor's fields are non-const by the C ABI; nothing writes through them.
  t.shape = const_cast<int64_t*>(ctx->tensor.sizes().data());
  t.strides = const_cast<int64_t*>(ctx->tensor.strides().data());
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = [](DLManagedTensor* m) {
    delete static_cast<ExportContext*>(m->manager_ctx);
  };
  return &ctx->managed;
}

}  // namespace sdpa
