#pragma once
// Shared declarations of the sdpa._C bindings: one bind_* function per family, and the
// DLPack conversions every family uses.

#include <nanobind/nanobind.h>

#include <cstdint>

#include "sdpa/sdpa.h"

namespace sdpa::python {

namespace nb = nanobind;

/// Returns the sdpa::Tensor an argument holds, without copying: an sdpa._C.Tensor, or a
/// DLPack capsule ("dltensor" or "dltensor_versioned", renamed "used_..." once taken).
/// Throws nb::type_error naming `arg` for anything else. The Python side
/// (sdpa/_convert.py) turns arrays with __dlpack__ into capsules first.
Tensor import_tensor(nb::handle obj, const char* arg);

/// Calls sdpa._convert.to_capsule(obj, arg, stream) and imports the capsule: any object
/// with __dlpack__ (numpy, torch, jax) or an sdpa._C.Tensor. `stream` (a cudaStream_t; 0
/// the legacy default stream) is the stream the call will read a CUDA array on: its
/// producer makes its writes visible there. Needs the GIL.
Tensor import_array(nb::handle obj, const char* arg, uintptr_t stream = 0);

/// Wraps a result in a new sdpa._C.Tensor (shares storage). A CUDA result records
/// `stream`, the cudaStream_t it was written on, for its __dlpack__.
nb::object export_tensor(Tensor tensor, uintptr_t stream = 0);

/// Returns a fresh DLPack capsule ("dltensor", the legacy protocol every consumer reads)
/// sharing `tensor`'s storage; its destructor frees the export unless a consumer took it.
nb::object legacy_capsule(Tensor tensor);

/// The attn_mask argument: None, an sdpa._C.AttnBias, or an array (a dense mask).
AttnMask import_mask(nb::handle obj);

void bind_tensor(nb::module_& m);
void bind_backend(nb::module_& m);
void bind_bias(nb::module_& m);
void bind_generator(nb::module_& m);
void bind_attention(nb::module_& m);
void bind_info(nb::module_& m);
void bind_flex(nb::module_& m);
void bind_torch(nb::module_& m);
void bind_cuda(nb::module_& m);
void bind_serving(nb::module_& m);
/// jax_ffi.cpp, built only with jax's XLA FFI headers (SDPA_XLA_FFI defined).
void bind_jax_ffi(nb::module_& m);

}  // namespace sdpa::python
