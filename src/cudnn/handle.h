#pragma once
// cuDNN (loaded at run time), its handles (one per thread and device, created on first
// use) and status checks.

#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <string>

namespace sdpa::cudnn {

/// "" when cuDNN is loaded, else why not (the library file is missing, ...): loads it on
/// the first call.
const std::string& cudnn_load_error();

/// The calling thread's handle for `device`, bound to `stream`. Throws sdpa::Error when
/// cuDNN cannot create one (no device, a cuDNN library too old for this build).
cudnnHandle_t handle_for(int device, cudaStream_t stream);

/// Throws sdpa::Error "<call>: <cuDNN's error string>" unless status is success.
void check(cudnnStatus_t status, const char* call);

}  // namespace sdpa::cudnn
