#pragma once
// DLPack >= 1.0 declarations that Debian's dlpack.h (0.6) predates: the versioned managed
// tensor and the C exchange table frameworks publish as `__dlpack_c_exchange_api__`
// (DLPack 1.2's proposal #175; torch >= 2.10). Both layouts are part of DLPack's stable
// ABI: within a major version, fields are only ever appended.

#include <dlpack/dlpack.h>

#include <cstdint>

#include "sdpa/tensor.h"

namespace sdpa::python {

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

inline constexpr uint32_t kDLPackMajor = 1;

/// The header every exchange table starts with.
struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  DLPackExchangeAPIHeader* prev_api;
};

/// A framework's C functions for exchanging tensors without Python calls. All return 0 on
/// success and -1 with a Python error set; none syncs a stream (CPU tensors need none).
struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  // (prototype, out, error_ctx, set_error): a new framework-owned tensor.
  int (*managed_tensor_allocator)(DLTensor*, DLManagedTensorVersioned**, void*,
                                  void (*)(void*, const char*, const char*));
  // (py_object, out): an owning export of a framework tensor.
  int (*managed_tensor_from_py_object_no_sync)(void*, DLManagedTensorVersioned**);
  // (tensor, out_py_object): a framework tensor taking ownership of `tensor`.
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned*, void**);
  // (py_object, out): a non-owning view, valid while the object lives and unchanged.
  int (*dltensor_from_py_object_no_sync)(void*, DLTensor*);
  // (device_type, device_id, out_stream): the framework's current stream.
  int (*current_work_stream)(DLDeviceType, int32_t, void**);
};

/// The capsule name of `__dlpack_c_exchange_api__`.
inline constexpr const char* kExchangeApiName = "dlpack_exchange_api";

/// Exports `tensor` without copying as a DLPack 1.0 managed tensor, which keeps the
/// storage alive until the consumer calls its deleter.
DLManagedTensorVersioned* export_versioned(Tensor tensor);

}  // namespace sdpa::python
