#pragma once
// float8_e4m3fn codes widened to bfloat16 in registers, for the vdpbf16ps decode kernels
// (bf16_decode.h) reading a float8 KV cache: every E4M3 value, subnormals included, is a
// bfloat16 value (3 mantissa bits in 7, exponents 2^-9 ... 2^8 in bfloat16's range), so the
// kernels compute on the cache's exact values.

#include <immintrin.h>

#include <array>
#include <bit>
#include <cstdint>

#include "cpu/rows.h"

namespace sdpa::cpu {

/// bfloat16 bits of the E4M3 magnitudes 0 ... 127 (127: NaN), in four 32-entry tables.
struct E4M3Bf16Table {
  __m512i t0, t1, t2, t3;
};

inline const std::array<uint16_t, 128> kE4M3Bf16Bits = [] {
  std::array<uint16_t, 128> bits{};
  for (size_t code = 0; code < bits.size(); ++code) {
    const uint32_t f = std::bit_cast<uint32_t>(kE4M3FNValues[code]);
    bits[code] = static_cast<uint16_t>(f >> 16);  // exact: 4 significant bits, or NaN
  }
  return bits;
}();

__attribute__((target("avx512f"))) inline E4M3Bf16Table LoadE4M3Bf16Table() {
  const uint16_t* b = kE4M3Bf16Bits.data();
  return {_mm512_loadu_si512(b), _mm512_loadu_si512(b + 32), _mm512_loadu_si512(b + 64),
          _mm512_loadu_si512(b + 96)};
}

/// 32 codes at p (those outside `mask` read as 0) as bfloat16 bits: vpermt2w looks up the
/// low 6 bits of each code in both halves of the table, bit 6 picks the half, bit 7 is the
/// sign.
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline __m512i E4M3ToBf16(
    const E4M3Bf16Table& table, const uint8_t* p, __mmask32 mask) {
  const __m512i codes = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(mask, p));
  const __m512i low = _mm512_permutex2var_epi16(table.t0, codes, table.t1);
  const __m512i high = _mm512_permutex2var_epi16(table.t2, codes, table.t3);
  const __mmask32 upper = _mm512_test_epi16_mask(codes, _mm512_set1_epi16(64));
  const __m512i magnitude = _mm512_mask_blend_epi16(upper, low, high);
  // magnitude | ((codes << 8) & 0x8000)
  return _mm512_ternarylogic_epi32(magnitude, _mm512_slli_epi16(codes, 8),
                                   _mm512_set1_epi16(static_cast<int16_t>(0x8000)), 0xF8);
}

}  // namespace sdpa::cpu
