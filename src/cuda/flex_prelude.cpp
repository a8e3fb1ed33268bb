// The definitions every generated flex unit starts with (flex_codegen.h): device source
// text, kept apart from the emitter so each reads on its own.

#include "cuda/flex_codegen.h"

namespace sdpa::cuda {

const std::string& flex_prelude() {
  static const std::string prelude = R"(// sdpa flex prelude
struct SdpaCapturedTensor {
  const void* data;
  long long sizes[8];
  long long strides[8];
  int dim;
};

// The first failure of a launch: code 1 an out-of-range captured read (slot, dimension,
// index), 2 an integer division by zero; where it happened.
struct SdpaFlexStatus {
  int code;
  int slot;
  int dim;
  long long index;
  long long b, h, q_idx, kv_idx;
};

struct SdpaAt {
  long long b, h, q_idx, kv_idx;
  SdpaFlexStatus* status;
};

__device__ __forceinline__ void sdpa_flex_fail(const SdpaAt& at, int code, int slot, int dim,
                                               long long index) {
  if (atomicCAS(&at.status->code, 0, code) == 0) {
    at.status->slot = slot;
    at.status->dim = dim;
    at.status->index = index;
    at.status->b = at.b;
    at.status->h = at.h;
    at.status->q_idx = at.q_idx;
    at.status->kv_idx = at.kv_idx;
  }
}

// Element `index` along dimension `dim` of captured tensor `slot`, or the failure.
__device__ __forceinline__ bool sdpa_in_range(const SdpaAt& at, const SdpaCapturedTensor& t,
                                              int slot, int dim, long long index) {
  if (index >= 0 && index < t.sizes[dim]) return true;
  sdpa_flex_fail(at, 1, slot, dim, index);
  return false;
}

__device__ __forceinline__ float sdpa_load_f32(const SdpaCapturedTensor& t, long long off) {
  return static_cast<const float*>(t.data)[off];
}
__device__ __forceinline__ float sdpa_load_bf16(const SdpaCapturedTensor& t, long long off) {
  const unsigned bits = static_cast<const unsigned short*>(t.data)[off];
  return __uint_as_float(bits << 16);
}
__device__ __forceinline__ float sdpa_load_f16(const SdpaCapturedTensor& t, long long off) {
  const unsigned h = static_cast<const unsigned short*>(t.data)[off];
  const unsigned sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float f = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  if (exponent == 31) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
__device__ __forceinline__ float sdpa_load_f64(const SdpaCapturedTensor& t, long long off) {
  return static_cast<float>(static_cast<const double*>(t.data)[off]);
}
__device__ __forceinline__ long long sdpa_load_i32(const SdpaCapturedTensor& t, long long off) {
  return static_cast<const int*>(t.data)[off];
}
__device__ __forceinline__ long long sdpa_load_i64(const SdpaCapturedTensor& t, long long off) {
  return static_cast<const long long*>(t.data)[off];
}
__device__ __forceinline__ bool sdpa_load_bool(const SdpaCapturedTensor& t, long long off) {
  return static_cast<const unsigned char*>(t.data)[off] != 0;
}

// Integer arithmetic wraps (two's complement), as numpy and torch.
__device__ __forceinline__ long long sdpa_add(long long a, long long b) {
  return static_cast<long long>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
}
__device__ __forceinline__ long long sdpa_sub(long long a, long long b) {
  return static_cast<long long>(static_cast<unsigned long long>(a) - static_cast<unsigned long long>(b));
}
__device__ __forceinline__ long long sdpa_mul(long long a, long long b) {
  return static_cast<long long>(static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b));
}
__device__ __forceinline__ long long sdpa_neg(long long a) {
  return static_cast<long long>(0ull - static_cast<unsigned long long>(a));
}
__device__ __forceinline__ long long sdpa_abs(long long a) { return a < 0 ? sdpa_neg(a) : a; }

// Python's floor division and modulo (the sign of a remainder follows the divisor).
__device__ __forceinline__ long long sdpa_floor_div(const SdpaAt& at, long long a, long long b) {
  if (b == 0) {
    sdpa_flex_fail(at, 2, -1, -1, 0);
    return 0;
  }
  if (b == -1) return sdpa_neg(a);
  long long q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
__device__ __forceinline__ long long sdpa_floor_mod(const SdpaAt& at, long long a, long long b) {
  if (b == -1) return 0;
  return sdpa_sub(a, sdpa_mul(sdpa_floor_div(at, a, b), b));
}

// Shifts by counts outside [0, 63] give 0 (<<) or the sign fill (>>), as torch.
__device__ __forceinline__ long long sdpa_shl(long long a, long long n) {
  return n < 0 || n > 63 ? 0 : static_cast<long long>(static_cast<unsigned long long>(a) << n);
}
__device__ __forceinline__ long long sdpa_shr(long long a, long long n) {
  return n < 0 || n > 63 ? (a < 0 ? -1 : 0) : a >> n;
}

// A float used as an index truncates as x86's cvttss2si (the CPU evaluator): NaN and
// values outside int64 give INT64_MIN.
__device__ __forceinline__ long long sdpa_float_to_int(float x) {
  if (!(x >= -9.2233720368547758e18f && x < 9.2233720368547758e18f)) {
    return -9223372036854775807ll - 1;
  }
  return static_cast<long long>(x);
}
)";
  return prelude;
}

}  // namespace sdpa::cuda
