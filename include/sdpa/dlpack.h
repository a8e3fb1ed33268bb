#pragma once
// Zero-copy exchange with other array libraries through DLPack (dlpack.h v0.6+).

#include "sdpa/tensor.h"

struct DLManagedTensor;

namespace sdpa {

/// Wraps a DLPack tensor without copying and takes ownership of `managed` (its deleter
/// runs when the last view of the returned Tensor goes). Supports float16/32/64,
/// bfloat16, bool, int32 and int64 on CPU (and records CUDA / external devices).
/// Throws sdpa::Error for a null pointer or an unsupported dtype (lanes != 1 included).
Tensor from_dlpack(DLManagedTensor* managed);

/// Wraps `managed`'s memory without copying and without taking ownership (its deleter is
/// not called): `owner` (may be null) is held by the returned Tensor, and otherwise the
/// caller keeps the memory alive while the Tensor and its views are read. For a call's
/// inputs, whose producer outlives the call, this saves from_dlpack's bookkeeping. Same
/// checks as from_dlpack.
Tensor view_dlpack(const DLManagedTensor& managed, std::shared_ptr<void> owner = nullptr);

/// Exports `tensor` without copying; the returned tensor keeps the storage alive until
/// its deleter is called by the consumer.
DLManagedTensor* to_dlpack(const Tensor& tensor);

}  // namespace sdpa
