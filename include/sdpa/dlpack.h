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

/// Exports `tensor` without copying; the returned tensor keeps the storage alive until
/// its deleter is called by the consumer.
DLManagedTensor* to_dlpack(const Tensor& tensor);

}  // namespace sdpa
