#pragma once
// Device-side types shared by the MATH and FLASH kernels on CUDA: the call's dense mask and
// sequence-frame bands as kernels read them, and element conversions to float. Written to
// compile both under nvcc and under NVRTC (the flash kernels with flex programs are
// compiled at run time, cuda/flash/flex_unit.h), where the C++ standard headers are absent:
// NVRTC units get the fixed-width integers and the two limits the kernels use from here.

#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#define INT_MAX 2147483647
#define INFINITY __int_as_float(0x7f800000)
#else
#include <climits>
#include <cmath>
#include <cstdint>
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sdpa::cuda::math {

/// The dense mask, if any, as a [B, Hq, L, S] view with broadcast (zero) strides.
struct DenseMask {
  const void* data = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int kind = 0;  // 0 none, 1 bool (true = keep), 2 additive in the query dtype, 3 float32
};

/// Diagonal bands in the sequence frame (every bias but is_causal reaches MATH as its
/// dense materialization): key j of row i takes part when lo <= j < hi for each.
constexpr int kMaxBands = 4;
struct Bands {
  int count = 0;
  int64_t offset[kMaxBands];  // diagonal of row 0: 0 (top-left) or S - L (bottom-right)
  int64_t left[kMaxBands];    // keys before the diagonal (INT64_MAX: unbounded)
  int64_t right[kMaxBands];   // keys after it (INT64_MAX: unbounded)
};

__device__ inline float to_acc(__half x) { return __half2float(x); }
__device__ inline float to_acc(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_acc(float x) { return x; }

}  // namespace sdpa::cuda::math
