#pragma once
// bfloat16 bit helpers of the per-target bf16 kernel tests.

#include <cstdint>
#include <cstring>

namespace sdpa::cpu::test {

/// The value of bfloat16 bits, exactly.
inline double Bf16ToDouble(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

/// bfloat16 bits of finite x, rounded to nearest even.
inline uint16_t ToBf16Bits(float x) {
  uint32_t word;
  std::memcpy(&word, &x, sizeof word);
  word += 0x7FFF + ((word >> 16) & 1);
  return static_cast<uint16_t>(word >> 16);
}

/// Whether this CPU has AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16).
inline bool CpuHasBf16() { return __builtin_cpu_supports("avx512bf16"); }

}  // namespace sdpa::cpu::test
