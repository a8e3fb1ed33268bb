#pragma once
// float8_e4m3fn codes widened to bfloat16 in registers, for the vdpbf16ps decode kernels
// (bf16_decode.h) reading a float8 KV cache: every E4M3 value, subnormals included, is a
// bfloat16 value (3 mantissa bits in 7, exponents 2^-9 ... 2^8 in bfloat16's range), so the
// kernels compute on the cache's exact values.
//
// AVX512_VBMI's two-table byte permute (vpermi2b) looks up 64 codes at once in a
// 128-entry byte table indexed by the code's 7 magnitude bits: one lookup for the low bytes
// of the bfloat16 bits, one for the high bytes, the sign ORed in, and a byte permute that
// interleaves them into words. Against word lookups (vpermt2w, 32 codes each, two halves of
// the table blended) this widens 1.8x the codes per second on Zen 4 (L1-resident rows).
// The callers check vbmi_available() (bf16_dot.h).

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

#include "cpu/rows.h"

namespace sdpa::cpu {

/// The lookup tables in registers: the low and the high bytes of the bfloat16 bits of the
/// E4M3 magnitudes 0 ... 127 (127: NaN), two vectors each, and the byte permutes that
/// interleave low and high bytes into the words of codes 0 ... 31 and 32 ... 63.
struct E4M3Bf16Table {
  __m512i low0, low1, high0, high1, words0, words1;
};

/// The tables' bytes: the low and the high bytes of the bfloat16 bits of the magnitudes,
/// and the permutes' indices (word k of codes 0 ... 31: the low (index k) and the high
/// (index 64 + k) byte of code k; of codes 32 ... 63 likewise from index 32 and 96).
struct E4M3Bf16TableBytes {
  std::array<uint8_t, 128> low, high;
  std::array<uint8_t, 64> words0, words1;
};

inline const E4M3Bf16TableBytes kE4M3Bf16TableBytes = [] {
  E4M3Bf16TableBytes t{};
  for (size_t code = 0; code < 128; ++code) {
    // exact: 4 significant bits, or NaN
    const uint32_t bf16 = std::bit_cast<uint32_t>(kE4M3FNValues[code]) >> 16;
    t.low[code] = static_cast<uint8_t>(bf16 & 0xFF);
    t.high[code] = static_cast<uint8_t>(bf16 >> 8);
  }
  for (size_t k = 0; k < 32; ++k) {
    t.words0[2 * k] = static_cast<uint8_t>(k);
    t.words0[2 * k + 1] = static_cast<uint8_t>(64 + k);
    t.words1[2 * k] = static_cast<uint8_t>(32 + k);
    t.words1[2 * k + 1] = static_cast<uint8_t>(96 + k);
  }
  return t;
}();

__attribute__((target("avx512f"))) inline E4M3Bf16Table LoadE4M3Bf16Table() {
  const E4M3Bf16TableBytes& t = kE4M3Bf16TableBytes;
  return {_mm512_loadu_si512(t.low.data()),    _mm512_loadu_si512(t.low.data() + 64),
          _mm512_loadu_si512(t.high.data()),   _mm512_loadu_si512(t.high.data() + 64),
          _mm512_loadu_si512(t.words0.data()), _mm512_loadu_si512(t.words1.data())};
}

/// The low and high bytes of the bfloat16 bits of 64 codes.
struct E4M3Bf16Bytes {
  __m512i low, high;
};

__attribute__((target("avx512f,avx512bw,avx512vbmi"), always_inline)) inline E4M3Bf16Bytes
E4M3Bf16BytesOf(const E4M3Bf16Table& table, __m512i codes) {
  const __m512i low = _mm512_permutex2var_epi8(table.low0, codes, table.low1);
  const __m512i high = _mm512_permutex2var_epi8(table.high0, codes, table.high1);
  // high | (codes & 0x80): the sign
  return {low,
          _mm512_ternarylogic_epi32(high, codes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8)};
}

/// 32 codes at p (those outside `mask` read as 0) as bfloat16 bits, in element order.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"), always_inline)) inline __m512i
E4M3ToBf16(const E4M3Bf16Table& table, const uint8_t* p, __mmask32 mask) {
  const E4M3Bf16Bytes b = E4M3Bf16BytesOf(table, _mm512_maskz_loadu_epi8(mask, p));
  return _mm512_permutex2var_epi8(b.low, table.words0, b.high);
}

/// dst[0, n) = the bfloat16 bits of the codes src[0, n) (exact).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) inline void WidenE4M3Row(
    const uint8_t* src, int64_t n, uint16_t* dst) {
  const E4M3Bf16Table table = LoadE4M3Bf16Table();
  for (int64_t i = 0; i < n; i += 64) {
    const int64_t count = std::min<int64_t>(64, n - i);
    const __mmask64 mask = count == 64 ? ~__mmask64{0} : (__mmask64{1} << count) - 1;
    const E4M3Bf16Bytes b = E4M3Bf16BytesOf(table, _mm512_maskz_loadu_epi8(mask, src + i));
    _mm512_mask_storeu_epi16(dst + i, static_cast<__mmask32>(mask),
                             _mm512_permutex2var_epi8(b.low, table.words0, b.high));
    _mm512_mask_storeu_epi16(dst + i + 32, static_cast<__mmask32>(mask >> 32),
                             _mm512_permutex2var_epi8(b.low, table.words1, b.high));
  }
}

}  // namespace sdpa::cpu
