#include "sdpa/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "sdpa/error.h"

namespace sdpa {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kBool: return 1;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kFloat8E4M3FN: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat16: return "float16";
    case DType::kBool: return "bool";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat8E4M3FN: return "float8_e4m3fn";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                  DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat8E4M3FN}) {
    if (dtype_name(d) == name) return d;
  }
  if (name == "float" || name == "fp32") return DType::kFloat32;
  if (name == "double" || name == "fp64") return DType::kFloat64;
  if (name == "bf16") return DType::kBFloat16;
  if (name == "half" || name == "fp16") return DType::kFloat16;
  detail::throw_error("dtype: expected one of float32, float64, bfloat16, float16, bool, "
                      "int32, int64, float8_e4m3fn; got '", name, "'");
}

bool is_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat16;
}

std::string device_name(Device device) {
  switch (device.type) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda:" + std::to_string(device.index);
    case DeviceType::kExternal: return "external:" + std::to_string(device.index);
  }
  return "device(" + std::to_string(static_cast<int>(device.type)) + "):" +
         std::to_string(device.index);
}

// IEEE binary16 <-> binary32, round to nearest even (the standard bit-level conversion).
float16::float16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep quiet bit set
    bits = static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    return;
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: infinity
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) {  // below half the smallest subnormal: zero
      bits = static_cast<uint16_t>(sign);
      return;
    }
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    bits = static_cast<uint16_t>(sign | half);
    return;
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  bits = static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float16::operator float() const {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1fu) {
    out = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;
  } else {  // subnormal: normalize
    uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    out = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

float8_e4m3fn::float8_e4m3fn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    bits = static_cast<uint8_t>(sign | 0x7fu);
    return;
  }
  if (abs < 0x3c800000u) {  // below 2^-6, the smallest normal: multiples of 2^-9
    float magnitude;
    std::memcpy(&magnitude, &abs, 4);
    // Rounds to nearest even (the default mode); 8 * 2^-9 is the smallest normal, whose
    // code is 8 too.
    bits = static_cast<uint8_t>(sign | static_cast<uint32_t>(std::nearbyint(magnitude * 512.0f)));
    return;
  }
  // Round the 23 mantissa bits to 3, to nearest even, then rebias the exponent 127 -> 7.
  const uint32_t rounded = (abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - ((127u - 7u) << 3);
  bits = static_cast<uint8_t>(sign | std::min(code, 0x7eu));  // past 448: saturate
}

float8_e4m3fn::operator float() const {
  const uint32_t exponent = (bits >> 3) & 0xfu, mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 0xfu && mantissa == 0x7u) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<float>(8u + mantissa), static_cast<int>(exponent) - 10);
  }
  return (bits & 0x80u) ? -magnitude : magnitude;
}

}  // namespace sdpa
