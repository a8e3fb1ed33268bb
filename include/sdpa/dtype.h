#pragma once
// Element types, devices and the 16-bit float storage types.

#include <cstdint>
#include <cstring>
#include <string_view>

namespace sdpa {

/// Element type of a Tensor. Half types are stored as 16 bits and computed in float32.
/// float8_e4m3fn is a storage type for quantized KV caches (attention_with_kvcache), not an
/// attention input dtype.
enum class DType : uint8_t {
  kFloat32, kFloat64, kBFloat16, kFloat16, kBool, kInt32, kInt64, kFloat8E4M3FN
};

/// Bytes per element.
size_t element_size(DType dtype);
/// "float32", "bfloat16", ... (PyTorch's names).
std::string_view dtype_name(DType dtype);
/// Parses a dtype_name(); throws sdpa::Error for unknown names.
DType parse_dtype(std::string_view name);
/// True for float32, float64, bfloat16 and float16 (the attention input dtypes).
bool is_floating(DType dtype);

/// Kind of memory a Tensor lives in. Values match DLPack's DLDeviceType.
enum class DeviceType : int32_t { kCPU = 1, kCUDA = 2, kExternal = 12 };

/// A device: type plus ordinal (DLPack's DLDevice).
struct Device {
  DeviceType type = DeviceType::kCPU;
  int32_t index = 0;
  friend bool operator==(const Device&, const Device&) = default;
};
/// "cpu", "cuda:0", "external:1".
std::string device_name(Device device);

/// bfloat16 storage: the upper 16 bits of an IEEE float32. Conversion from float rounds
/// to nearest even; NaN stays NaN.
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40u);
    } else {
      bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// IEEE 754 binary16 storage. Conversion from float rounds to nearest even, overflows to
/// infinity and keeps subnormals.
struct float16 {
  uint16_t bits = 0;
  float16() = default;
  explicit float16(float f);
  explicit operator float() const;
};

/// FP8 E4M3 storage as in the OCP 8-bit floating point spec and torch.float8_e4m3fn ("fn":
/// finite, no infinities): 1 sign, 4 exponent (bias 7) and 3 mantissa bits, largest
/// finite value 448, smallest subnormal 2^-9; S.1111.111 is NaN. Conversion from float
/// rounds to nearest even and saturates to +-448 (as vLLM's and llama.cpp's KV-cache
/// quantizers do; torch's cast gives NaN past 448); NaN stays NaN.
struct float8_e4m3fn {
  uint8_t bits = 0;
  float8_e4m3fn() = default;
  explicit float8_e4m3fn(float f);
  explicit operator float() const;
};

}  // namespace sdpa
